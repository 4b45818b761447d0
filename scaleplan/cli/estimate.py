"""`scaleplan estimate` and `scaleplan layouts`: not implemented yet (exit 2)."""
from scaleplan.errors import NotImplementedYet


def estimate() -> None:
    raise NotImplementedYet("scaleplan estimate: not implemented yet")


def layouts() -> None:
    raise NotImplementedYet("scaleplan layouts: not implemented yet")
