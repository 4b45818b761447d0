"""`scaleplan validate`: not implemented yet (exit 2)."""
from scaleplan.errors import NotImplementedYet


def validate() -> None:
    raise NotImplementedYet("scaleplan validate: not implemented yet")
