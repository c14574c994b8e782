"""`satseq eval`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from satseq.cli.common import (
    AddressOption,
    CheckpointDirOption,
    SetOption,
    StageOption,
    ToolsOption,
    fail,
    resolve_config_for,
)


def evaluate(
    dataset: Annotated[
        str,
        typer.Option(help="aime24 | aime25 | math | a .jsonl/.parquet file | synthetic:test"),
    ],
    checkpoint_dir: CheckpointDirOption,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="where outputs are written")],
    samples_per_agent: Annotated[
        int | None, typer.Option("--samples-per-agent", min=1, help="K (default eval.*)")
    ] = None,
    stage: StageOption = None,
    tools: ToolsOption = False,
    set_: SetOption = None,
    address: AddressOption = None,
    against: Annotated[
        Path | None,
        typer.Option(
            "--against",
            help="an earlier eval's --output-dir on the same dataset: pair the team votes "
            "problem by problem (gained, lost, McNemar's exact p)",
        ),
    ] = None,
) -> None:
    """Score the team: K samples per agent per problem, the team's vote, pass@k/avg@k/maj@k.

    The config is the checkpoint dir's train_config.yaml (else the quickstart's) plus --set.
    With tools (the config's rollout.tools.enabled, or --tools) every sample runs the tool loop
    on a sandbox pool, and summary.json's "tools" reports call_fraction, calls_mean and the
    sandbox's statuses. With --against DIR, summary.json's "against" holds the problems the
    vote gained and lost since DIR's evaluation, and McNemar's exact p-value.
    """
    from satseq.data import DataError
    from satseq.evaluation import CheckpointError, summary_table
    from satseq.evaluation.compare import PairedVotes
    from satseq.evaluation.runner import run_evaluation

    config = resolve_config_for(checkpoint_dir, set_, tools)
    try:
        _, summary = run_evaluation(
            config, dataset, checkpoint_dir, output_dir, samples_per_agent, stage, address, against
        )
    except (DataError, CheckpointError) as err:
        raise fail(str(err)) from None
    Console().print(summary_table(summary))
    if against is not None:
        typer.echo(PairedVotes(**summary["against"]).describe())
    typer.echo(f"outputs: {output_dir}")
