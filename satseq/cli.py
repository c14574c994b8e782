"""The `satseq` command (DESIGN §10). Each subcommand is a thin shell over a library call."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from satseq.config import ConfigError, dump_config, load_config

app = typer.Typer(
    help="satseq: RL post-training of LLM teams (SAT-Seq, SPO, GRPO) on Ray, and serving the team.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the run configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

errors = Console(stderr=True, soft_wrap=True)

ConfigArg = Annotated[
    Path | None,
    typer.Argument(help="YAML config; default configs/quickstart.yaml", show_default=False),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a key: --set trainer.stages=4 (repeatable)"),
]


def fail(message: str) -> typer.Exit:
    """Print a user-facing error and return the exit to raise (status 2: bad input)."""
    errors.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    return typer.Exit(code=2)


@config_app.command("show")
def config_show(config: ConfigArg = None, set_: SetOption = None) -> None:
    """Print the resolved config as YAML: the file, then every --set override, then defaults."""
    try:
        resolved = load_config(config, set_ or [])
    except ConfigError as err:
        raise fail(str(err)) from None
    typer.echo(dump_config(resolved), nl=False)


def main() -> None:
    app()
