"""Every public function and method of estimator/ states its types: each parameter (self and cls aside) and
the return (``__init__`` aside) are annotated, so a reader sees what is an array over plans (``ArrayLike`` in,
``np.ndarray`` out), a table, a profile or a scalar without reading the body."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def unannotated(path: Path) -> list[str]:
    """``"file:line name (what is missing)"`` for every public function (module level, or a method of a public
    class) with a parameter or the return unannotated."""
    out = []

    def check(fn: ast.FunctionDef, owner: str = "") -> None:
        if fn.name.startswith("_") and fn.name != "__init__":
            return
        a = fn.args
        params = [p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
        params += [p for p in (a.vararg, a.kwarg) if p is not None]
        missing = [p.arg for p in params if p.annotation is None]
        if fn.returns is None and fn.name != "__init__":
            missing.append("return")
        if missing:
            out.append(f"{path.name}:{fn.lineno} {owner}{fn.name} ({', '.join(missing)})")

    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            check(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    check(m, f"{node.name}.")
    return out


def test_every_public_estimator_function_is_annotated():
    files = sorted((ROOT / "estimator").glob("*.py"))
    assert files and [hit for p in files for hit in unannotated(p)] == []


def test_the_checker_sees_parameters_returns_and_methods(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f(a, b: int) -> int:\n    return b\n\ndef g(a: int):\n    pass\n\ndef _h(a):\n    pass\n\n"
                 "class C:\n    def __init__(self, x: int):\n        pass\n\n    def m(self, *xs, **kw) -> None:\n"
                 "        pass\n\nclass _D:\n    def m(self, y):\n        pass\n")
    assert unannotated(f) == ["m.py:1 f (a)", "m.py:4 g (return)", "m.py:14 C.m (xs, kw)"]
