"""`scaleplan search`: not implemented yet (exit 2)."""
from scaleplan.errors import NotImplementedYet


def search() -> None:
    raise NotImplementedYet("scaleplan search: not implemented yet")
