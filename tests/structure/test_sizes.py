"""Small legible modules (developers' guide, issue 25): no file in estimator/ over 500 lines and no
function over 60 lines in estimator/ or scaleplan/cli. A function's length is from its ``def`` line
(decorators excluded) to its last line, docstring and comments included: what a reader has to hold."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``"file:line name (n lines)"`` for every function or method longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{path.name}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_estimator_file_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "estimator").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert long == {}


def test_no_function_over_60_lines_in_the_estimator_or_the_cli():
    files = [*sorted((ROOT / "estimator").rglob("*.py")), *sorted((ROOT / "scaleplan" / "cli").rglob("*.py"))]
    assert files and [f for p in files for f in long_functions(p)] == []


def test_the_length_counts_from_def_to_last_line(tmp_path):
    """The checker itself: def + 60 body lines is 61 (too long), the decorator does not count, nested
    and async functions are seen."""
    f = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    short = "\n".join(f"    y{i} = {i}" for i in range(59))
    f.write_text(f"@decorator\ndef long():\n{body}\n\ndef short():\n{short}\n\n"
                 f"class C:\n    async def m(self):\n        def inner():\n{body.replace('    ', '            ')}\n")
    assert long_functions(f) == ["m.py:2 long (61 lines)", "m.py:126 m (62 lines)", "m.py:127 inner (61 lines)"]
