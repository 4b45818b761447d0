"""docs/architecture.md's concept -> module table is true to the code: every estimator module has a row,
every file it names exists, and every name it gives in parentheses after a file is defined there (a
top-level function, class or constant, or ``Class.member``)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
FILE = re.compile(r"`([\w/]+\.py)`(?: \(([^)]*)\))?")


def _rows() -> list[str]:
    return [line for line in DOC.read_text().splitlines() if line.startswith("| ")]


def _defined(path: Path) -> set[str]:
    """Top-level names of ``path`` and ``Class.member`` for the members of its classes."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
            if isinstance(node, ast.ClassDef):
                for m in node.body:
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        out.add(f"{node.name}.{m.name}")
                    elif isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name):
                        out.add(f"{node.name}.{m.target.id}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def test_every_estimator_module_has_a_row():
    text = "\n".join(_rows())
    missing = [p.name for p in sorted((ROOT / "estimator").glob("*.py"))
               if p.name != "__init__.py" and f"estimator/{p.name}" not in text]
    assert missing == []


def test_named_files_exist_and_define_the_names_given():
    bad = []
    for row in _rows():
        for path, names in FILE.findall(row):
            f = ROOT / path
            if not f.exists():
                bad.append(f"{path}: no such file")
                continue
            defined = _defined(f)
            for name in re.findall(r"`([\w.]+)`", names or ""):
                if name.startswith("test_") or name.endswith(".py") or "/" in name:
                    continue
                if name not in defined:
                    bad.append(f"{path}: {name} not defined")
    assert bad == []


def test_the_checker_sees_functions_classes_members_and_constants(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("X = 1\nY: int = 2\ndef f():\n    Z = 3\nclass C:\n    a: int\n    def m(self):\n        pass\n")
    assert _defined(f) == {"X", "Y", "f", "C", "C.a", "C.m"}
    row = "| x | `estimator/layout.py` (`ParallelLayout`, `RULES`), `estimator/ckpt.py` |"
    assert FILE.findall(row) == [("estimator/layout.py", "`ParallelLayout`, `RULES`"), ("estimator/ckpt.py", "")]
