"""`scaleplan bench`: not implemented yet (exits 2, never pretends)."""
import typer

from scaleplan.errors import NotImplementedYet

app = typer.Typer(no_args_is_help=False, invoke_without_command=True)


@app.callback()
def _stub(ctx: typer.Context) -> None:
    raise NotImplementedYet("scaleplan bench: not implemented yet")
