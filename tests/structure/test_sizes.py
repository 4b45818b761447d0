"""Small legible modules (developers' guide): no file over 500 lines and no function over 60 lines
anywhere in the package, i.e. the folders pyproject.toml maps into ``scaleplan`` (the Alembic migrations
excepted: a revision is one schema step, written once and never edited). A function's length is from its
``def`` line (decorators excluded) to its last line, docstring and comments included: what a reader has
to hold."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60
PACKAGE = ("scaleplan", "bench", "calibrate", "cluster_profiles", "estimator")
EXCEPTED = ("db_migrations",)


def package_files() -> list[Path]:
    """Every Python file of the package but the migrations."""
    return [p for folder in PACKAGE for p in sorted((ROOT / folder).rglob("*.py"))]


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``"file:line name (n lines)"`` for every function or method longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                out.append(f"{name}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_the_checked_folders_are_the_package():
    """A folder mapped into the package later is checked too, or named an exception here."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    assert {d.split("/")[0] for d in dirs} == set(PACKAGE) | set(EXCEPTED)


def test_no_file_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in package_files()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert long == {}


def test_no_function_over_60_lines():
    files = package_files()
    assert len(files) > 100 and [f for p in files for f in long_functions(p)] == []


def test_the_length_counts_from_def_to_last_line(tmp_path):
    """The checker itself: def + 60 body lines is 61 (too long), the decorator does not count, nested
    and async functions are seen."""
    f = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    short = "\n".join(f"    y{i} = {i}" for i in range(59))
    f.write_text(f"@decorator\ndef long():\n{body}\n\ndef short():\n{short}\n\n"
                 f"class C:\n    async def m(self):\n        def inner():\n{body.replace('    ', '            ')}\n")
    assert long_functions(f) == ["m.py:2 long (61 lines)", "m.py:126 m (62 lines)", "m.py:127 inner (61 lines)"]
