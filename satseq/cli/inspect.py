"""`satseq config show` and `satseq report`: looking at a config and at a run's outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from satseq.cli.common import ConfigArg, OverridesArg, SetOption, fail, resolve_config
from satseq.config import dump_config

config_app = typer.Typer(help="Inspect the run configuration.", no_args_is_help=True)


@config_app.command("show")
def config_show(
    config: ConfigArg = None,
    overrides: OverridesArg = None,
    set_: SetOption = None,
    key: Annotated[
        str | None, typer.Option("--key", help="print only this dotted key's value")
    ] = None,
) -> None:
    """Print the resolved config as YAML: the file, then every KEY=VALUE and --set override,
    then defaults. With --key (e.g. grpo.group_size), only that value (what scripts read)."""
    resolved = resolve_config(config, set_, overrides)
    if key is None:
        typer.echo(dump_config(resolved), nl=False)
        return
    value = yaml.safe_load(dump_config(resolved))
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise fail(f"--key {key}: the config has no key {part!r} there")
        value = value[part]
    typer.echo(value if not isinstance(value, dict | list) else yaml.safe_dump(value), nl=True)


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
