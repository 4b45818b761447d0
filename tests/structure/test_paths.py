"""Nothing in the repository names a path outside it: no absolute machine path, and every
document a file cites (``*.md``, ``*.tex``) is in the repository, or is the data folder beside it
(``../shared``, which README.md says how to obtain and which the tests read at test time)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".ini", ".mako", ".j2", ".cfg", ".txt", ".sh", ""}
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:work|home|Users|tmp|root|mnt|scratch|data|opt)/[\w.-]+")
DOCUMENT = re.compile(r"[\w./-]*[\w-]\.(?:md|tex)\b")
OUTSIDE_OK = ("../shared/", "shared/")  # the data folder beside the repository


def _files() -> list[Path]:
    """The committed text files (``git ls-files``; without git, every file outside hidden and build
    folders): what a clone holds, not what a test run leaves behind."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True).stdout
        paths = [ROOT / f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in ROOT.rglob("*") if not any(part.startswith(".") or part in SKIP_DIRS
                                                        for part in p.relative_to(ROOT).parts)]
    keep = []
    for p in sorted(paths):
        rel = p.relative_to(ROOT)
        if any(part.endswith(".egg-info") for part in rel.parts) or rel.parts[:2] == ("tests", "data"):
            continue
        if p.is_file() and p.suffix in TEXT:
            keep.append(p)
    return keep


def absolute_paths(text: str) -> list[str]:
    return ABSOLUTE.findall(text)


def missing_documents(path: Path, text: str) -> list[str]:
    """Cited ``*.md``/``*.tex`` names found neither beside ``path``, nor from the root, nor in docs/."""
    bad = []
    for name in set(DOCUMENT.findall(text)):
        if name.startswith(OUTSIDE_OK) or "*" in name:
            continue
        if not any((base / name).exists() for base in (path.parent, ROOT, ROOT / "docs")):
            bad.append(name)
    return bad


def test_no_file_names_an_absolute_machine_path():
    found = {str(p.relative_to(ROOT)): hits for p in _files() if (hits := absolute_paths(p.read_text(errors="ignore")))}
    assert found == {}


def test_every_cited_document_is_in_the_repository():
    found = {str(p.relative_to(ROOT)): bad for p in _files()
             if (bad := missing_documents(p, p.read_text(errors="ignore")))}
    assert found == {}


def test_the_checks_find_what_they_look_for(tmp_path):
    tmp, work = "/" + "tmp", "/" + "work"  # split, so this file does not name them itself
    assert absolute_paths(f'db = "sqlite:///{tmp}/rec.db"; see {work}/main/x.py') == [f"{tmp}/rec.db", f"{work}/main"]
    assert absolute_paths("a ../shared/recorded folder, http://host/data/x, ~/data/y") == []
    lost = "docs/notes-lost" + ".md"
    assert missing_documents(tmp_path / "m.py", f"see docs/architecture.md and {lost}, ../shared/paper/mosaic.tex") \
        == [lost]
