"""The package imports only downward (docs/architecture.md, "Rules the structure tests hold"): a module imports from its own
layer or below, so bench never imports validate or the CLI, and no library module imports the CLI. Every import statement counts, the ones inside
functions (lazy imports) included, so a deferred import cannot hide an upward edge."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the top-level folders pyproject.toml's package-dir maps into the one import package `scaleplan`
FOLDERS = {"scaleplan": "scaleplan", "bench": "scaleplan.bench", "estimator": "scaleplan.estimator",
           "calibrate": "scaleplan.calibrate", "db_migrations": "scaleplan.db_migrations",
           "cluster_profiles": "scaleplan.cluster_profiles"}
# `python -m scaleplan ARGS` and the console script are the command line itself, so they may import it
ENTRY_POINTS = {"scaleplan.__main__", "scaleplan.console"}
# docs/architecture.md's layers, lowest first (the longest matching prefix decides)
LAYERS = {
    "scaleplan.specs": 1, "scaleplan.stack": 1, "scaleplan.geometry": 1, "scaleplan.profiles": 1, "scaleplan.errors": 1,
    "scaleplan.units": 1, "scaleplan.progress": 1, "scaleplan.lazy": 1, "scaleplan.yamlio": 1,
    "scaleplan.catalogue": 1, "scaleplan.published": 1, "scaleplan.hf_config": 1,
    "scaleplan.db": 2, "scaleplan.reference": 3, "scaleplan.estimator": 4, "scaleplan.bench": 4,
    "scaleplan.calibrate": 5, "scaleplan.mosaic": 5, "scaleplan.validate": 5, "scaleplan.emit": 5,
    "scaleplan.megatron": 5, "scaleplan.report": 5, "scaleplan.cli": 6,
}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path) -> set[str]:
    """Every module ``module`` names in an import, absolute, ``from X import y`` giving X.y as well
    (y may be a submodule)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            names.add(target)
            names.update(f"{target}.{a.name}" for a in node.names)
    return names


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def layer(module: str) -> int | None:
    """The layer of a package module; None for anything outside the table (third-party, stdlib)."""
    hits = [k for k in LAYERS if _under(module, k)]
    return LAYERS[max(hits, key=len)] if hits else None


def upward_imports() -> list[str]:
    """``"A imports B (layer a -> b)"`` for every import of a higher layer."""
    bad = []
    for module, path in _modules().items():
        if module in ENTRY_POINTS or layer(module) is None:
            continue
        for name in sorted(imports_of(module, path)):
            if (layer(name) or 0) > layer(module):
                bad.append(f"{module} imports {name} (layer {layer(module)} -> {layer(name)})")
    return bad


def test_no_module_imports_upward():
    assert upward_imports() == []


@pytest.mark.parametrize("module, name", [
    ("scaleplan.bench.suites.allocator", "scaleplan.validate.runner"),
    ("scaleplan.bench.plan", "scaleplan.cli"),
    ("scaleplan.estimator.api", "scaleplan.cli._common"),
    ("scaleplan.mosaic.search", "scaleplan.cli.search"),
])
def test_the_named_upward_edges_are_upward(module, name):
    """bench -> validate, bench -> cli and library -> cli are all refused by the layer table."""
    assert layer(name) > layer(module)


def test_every_package_module_has_a_layer():
    """A new top-level module must be placed in the table, or the walk would skip it."""
    unplaced = [m for m in _modules() if layer(m) is None and m not in ENTRY_POINTS
                and not _under(m, "scaleplan.db_migrations") and not _under(m, "scaleplan.cluster_profiles")
                and m != "scaleplan"]
    assert unplaced == []


def test_the_walk_sees_lazy_and_relative_imports(tmp_path):
    """The checker itself: an import inside a function and a relative one are both found."""
    pkg = tmp_path / "bench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    f = pkg / "x.py"
    f.write_text("def f():\n    from scaleplan.validate import runner\n    from ..cli import main\n")
    assert {"scaleplan.validate.runner", "scaleplan.cli.main"} <= imports_of("scaleplan.bench.x", f)


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_every_package_folder_is_walked(folder):
    assert any(p.parent == ROOT / folder or ROOT / folder in p.parents for p in _modules().values())
