"""`satseq plan`: the device memory a config needs, per learner rank and rollout actor and phase,
from the models' configs alone (`satseq.launch.memory_plan`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from satseq.cli.common import ConfigArg, OverridesArg, SetOption, fail, resolve_config


def plan_memory(
    config: ConfigArg = None,
    overrides: OverridesArg = None,
    set_: SetOption = None,
    gpu_gib: Annotated[float, typer.Option("--gpu-gib", help="each GPU's memory")] = 80.0,
    prompt_tokens: Annotated[
        int, typer.Option("--prompt-tokens", help="a prompt's tokens (the data's longest)")
    ] = 512,
) -> None:
    """Print each device's predicted peak by phase; exit 1 naming every phase that does not fit
    (within 90 % of its memory) and by how much."""
    resolved = resolve_config(config, set_, overrides)
    from satseq.launch.memory_plan import USABLE, plan

    try:
        phases = plan(resolved, gpu_gib, prompt_tokens)
    except ValueError as error:
        raise fail(str(error)) from None
    table = Table("device", "phase", "peak GiB", "of GiB", "fits", "by part (GiB)")
    for phase in phases:
        parts = ", ".join(f"{name} {gib:.1f}" for name, gib in phase.parts.items())
        budget = "host" if phase.budget_gib == float("inf") else f"{phase.budget_gib:.0f}"
        fits = "yes" if phase.fits else "[red]no[/]"
        table.add_row(phase.who, phase.phase, f"{phase.peak_gib:.1f}", budget, fits, parts)
    Console().print(table)
    short = [phase for phase in phases if not phase.fits]
    for phase in short:
        over = phase.peak_gib - USABLE * phase.budget_gib
        typer.echo(
            f"does not fit: {phase.who}, {phase.phase}: {phase.peak_gib:.1f} GiB, {over:.1f} GiB "
            f"over {USABLE:.0%} of {phase.budget_gib:.0f} GiB",
            err=True,
        )
    if short:
        raise typer.Exit(code=1)
