"""Lazy imports for start-up time."""
from __future__ import annotations


def lazy_module(name: str):
    """``name`` imported on first attribute access (importlib.util.LazyLoader, the stdlib recipe), so a
    module can name a heavy dependency at the top (the ORM, pandas) and still not load it
    for work that never touches it (``--help``; the estimator reading cached tables).

    Raises ValueError for SQLAlchemy: a lazy ``sqlalchemy`` parent in ``sys.modules`` loads half-way
    when a submodule is imported first (``from sqlalchemy.orm import ...``: 'sqlalchemy.sql' has no
    attribute 'base'); import it inside the function that uses it instead."""
    if name.split(".")[0] == "sqlalchemy":
        raise ValueError(f"lazy_module: {name!r} cannot load lazily (its submodules import it half-way); "
                         "import it where it is used")
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:  # as the import system does: `scaleplan.specs` reachable as an attribute
        setattr(sys.modules[parent], child, module)
    return module
