"""Comments say why, not which ticket asked: no issue number in a comment or docstring of the package, its
tests or its benchmarks (the history is in git log; the tracker is not part of the repository)."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("scaleplan", "bench", "calibrate", "cluster_profiles", "db_migrations", "estimator", "tests",
           "benchmarks")
ISSUE = re.compile(r"\b[Ii]ssues?[ -]#?\d+")


def issue_numbers(path: Path) -> list[str]:
    """``"file:line text"`` for each comment or docstring line of ``path`` that names an issue number."""
    src = path.read_text()
    lines = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src, str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                lines += [(first + i, line) for i, line in enumerate(doc.splitlines())]
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return [f"{name}:{n} {text.strip()}" for n, text in sorted(lines) if ISSUE.search(text)]


def test_no_issue_numbers_in_comments_or_docstrings():
    files = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))
             if "data" not in p.relative_to(ROOT).parts]
    assert len(files) > 200 and [hit for p in files for hit in issue_numbers(p)] == []


def test_the_checker_sees_comments_and_docstrings_not_code(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""Module (issue 12)."""\nx = "issue 3"  # see issue 4.1\n\n\ndef f():\n    """Line one.\n\n'
                 '    Issue 7: why."""\n    return "a layer issues kernels"\n')
    assert [h.split(" ", 1)[0] for h in issue_numbers(f)] == ["m.py:1", "m.py:2", "m.py:8"]
