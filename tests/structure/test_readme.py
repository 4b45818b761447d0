"""The README is a front door: what scaleplan is, the set-up commands, the main job and how to read its
answer in under 800 words, then one short section per task linking to docs/ pages that exist; every docs page is
reachable from it."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _words(text: str) -> int:
    return len(text.split())


def test_the_quick_start_is_under_800_words():
    quick = README[:README.index("## Tasks")]
    for part in ("## Set up", "## The main job", "scaleplan search --profile", "How to read its answer"):
        assert part in quick, part
    assert _words(quick) < 800, _words(quick)
    assert _words(README) < 1300, _words(README)  # the task sections stay short: the detail is in docs/


def test_every_link_resolves_and_every_docs_page_is_linked():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [x for x in links if "://" not in x]
    assert local, "no links"
    for x in local:
        assert (ROOT / x).exists(), x
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= set(local), sorted(pages - set(local))
    for page in (ROOT / "docs").glob("*.md"):  # and the pages' own relative links
        for x in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in x and not x.startswith("mailto:"):
                assert (page.parent / x).exists(), (page.name, x)
