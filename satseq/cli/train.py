"""`satseq train`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from satseq.cli.common import AddressOption, ConfigArg, SetOption, resolve_config


def train(
    config: ConfigArg = None,
    set_: SetOption = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue after the last checkpoint")
    ] = False,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="default: output.dir/output.exp_name")
    ] = None,
    address: AddressOption = None,
) -> None:
    """Train the team; with no CONFIG, the embedded default (configs/quickstart.yaml)."""
    resolved = resolve_config(config, set_)  # before the heavy imports: errors come at once
    from satseq.cluster.driver import train as run_training

    run_training(resolved, str(output_dir) if output_dir else None, resume=resume, address=address)
