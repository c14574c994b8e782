"""`satseq config show` and `satseq report`: looking at a config and at a run's outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from satseq.cli.common import ConfigArg, SetOption, fail, resolve_config
from satseq.config import dump_config

config_app = typer.Typer(help="Inspect the run configuration.", no_args_is_help=True)


@config_app.command("show")
def config_show(config: ConfigArg = None, set_: SetOption = None) -> None:
    """Print the resolved config as YAML: the file, then every --set override, then defaults."""
    typer.echo(dump_config(resolve_config(config, set_)), nl=False)


def report(
    output_dir: Annotated[Path, typer.Argument(help="a `satseq train` output directory")],
) -> None:
    """Plot OUTPUT_DIR/metrics.jsonl as OUTPUT_DIR/report.png (reward, KL, β, backtracks, ...)."""
    from satseq.report import ReportError, write_report

    try:
        path = write_report(output_dir)
    except ReportError as err:
        raise fail(str(err)) from None
    typer.echo(f"report: {path}")
