"""`satseq train`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from satseq.cli.common import (
    AddressOption,
    ConfigArg,
    OverridesArg,
    SetOption,
    fail,
    resolve_config,
)
from satseq.config import RunConfig

SwapOption = Annotated[
    list[str] | None,
    typer.Option(
        "--swap",
        help="AGENT=PATH: swap the agent for the model at PATH before the next stage, projected "
        "towards its current policy (team.swaps; repeatable)",
    ),
]


def train(
    config: ConfigArg = None,
    overrides: OverridesArg = None,
    set_: SetOption = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue after the last checkpoint")
    ] = False,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="default: output.dir/output.exp_name")
    ] = None,
    address: AddressOption = None,
    swap: SwapOption = None,
) -> None:
    """Train the team; with no CONFIG, the embedded default (configs/quickstart.yaml).
    KEY=VALUE arguments and --set KEY=VALUE options override the config's keys."""
    resolved = resolve_config(config, set_, overrides)  # before the heavy imports: errors at once
    if swap:
        resolved = with_swaps(resolved, swap, next_stage(resolved, output_dir, resume))
    if any(resolved.agent_lora(i) for i in range(len(resolved.team.agents))):
        check_lora_team(resolved)
    from satseq.cluster.driver import train as run_training

    run_training(resolved, str(output_dir) if output_dir else None, resume=resume, address=address)


def check_lora_team(config: RunConfig) -> None:
    """A LoRA team's errors that need its models (target modules, tokenizers) here, before Ray
    starts; its fresh adapters are made here once (the model cache keeps them for the actors)."""
    from satseq.launch.agent_models import agent_model_dirs

    try:
        agent_model_dirs(config)
    except ValueError as err:
        raise fail(str(err)) from None


def next_stage(config: RunConfig, output_dir: Path | None, resume: bool) -> int:
    """The stage a run starts at: after the last checkpoint with --resume, else 0."""
    if not resume:
        return 0
    from satseq.cluster.checkpoint import checkpoint_stages
    from satseq.cluster.driver import output_dir_for

    stages = checkpoint_stages(output_dir_for(config, output_dir) / "checkpoints")
    return stages[-1] + 1 if stages else 0


def with_swaps(config: RunConfig, swaps: list[str], at_stage: int) -> RunConfig:
    """`config` with one `team.swaps` entry per --swap AGENT=PATH, at `at_stage` (the other
    fields keep their defaults), validated like the config file."""
    from pydantic import ValidationError

    from satseq.config.load import format_validation_error

    entries = []
    for text in swaps:
        agent, separator, path = text.partition("=")
        if not (separator and agent and path):
            raise fail(f"--swap {text!r}: expected AGENT=PATH, e.g. --swap a1=/models/stronger")
        entries.append({"agent": agent, "path": path, "at_stage": at_stage})
    data = config.model_dump()
    data["team"]["swaps"] = data["team"]["swaps"] + entries
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise fail(format_validation_error(err, "--swap")) from None
