"""`satseq train`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from satseq.cli.common import (
    AddressOption,
    ConfigArg,
    OverridesArg,
    PositionalOverride,
    SetOption,
    fail,
    resolve_config,
)
from satseq.config import TRAIN_CONFIG, RunConfig

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
        bool,
        typer.Option(
            "--resume",
            help="continue the run in --output-dir after its last checkpoint, with the config it "
            "was started with (CONFIG and overrides may change only what keeps it the same run)",
        ),
    ] = False,
    from_checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--from-checkpoint",
            help="RUN/checkpoints/stage_N: a new run (in --output-dir) that starts after that "
            "stage of RUN, with RUN's config",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="resume even where the config changes what a stage does"),
    ] = False,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="default: output.dir/output.exp_name")
    ] = None,
    address: AddressOption = None,
    swap: SwapOption = None,
) -> None:
    """Train the team; with no CONFIG, the embedded default (configs/quickstart.yaml).
    KEY=VALUE arguments and --set KEY=VALUE options override the config's keys."""
    if resume and from_checkpoint:
        raise fail("--resume continues a run, --from-checkpoint starts a new one: give one")
    if resume or from_checkpoint:
        resolved, output_dir = continued_run(
            config, overrides, set_, output_dir, force, from_checkpoint
        )
        resume = True
    else:  # before the heavy imports: errors at once
        resolved = resolve_config(config, set_, overrides)
    if swap:
        resolved = with_swaps(resolved, swap, next_stage(resolved, output_dir, resume))
    if any(resolved.agent_lora(i) for i in range(len(resolved.team.agents))):
        check_lora_team(resolved)
    from satseq.cluster.driver import train as run_training

    run_training(resolved, str(output_dir) if output_dir else None, resume=resume, address=address)


def continued_run(
    config: Path | PositionalOverride | None,
    overrides: list[str] | None,
    set_: list[str] | None,
    output_dir: Path | None,
    force: bool,
    from_checkpoint: Path | None,
) -> tuple[RunConfig, Path]:
    """The config and output directory of a resumed run (its saved config, changed only where
    `config.resume.SAFE_TO_CHANGE` allows, unless forced), or of a new run from another's
    checkpoint (copied into its own checkpoints/); a directory with no run is an error."""
    from satseq.config.resume import describe_differences, unsafe_differences

    if from_checkpoint is None:
        run_dir = output_dir or output_dir_for(resolve_config(config, set_, overrides), None)
        output_dir = run_dir
    else:
        run_dir = checkpoint_run(from_checkpoint)
    saved_path = run_dir / TRAIN_CONFIG
    if not (saved_path.is_file() or fetch_saved_config(run_dir, config, set_, overrides)):
        raise fail(f"{run_dir} holds no run ({TRAIN_CONFIG} not found): nothing to resume")
    given = config is not None and not isinstance(config, PositionalOverride)
    if given:
        wanted = resolve_config(config, set_, overrides)
    else:
        wanted = resolve_config(saved_path, set_, [*(overrides or []), *positional(config)])
    saved = resolve_config(saved_path, None)
    unsafe = unsafe_differences(saved, wanted)
    if unsafe and not force:
        raise fail(
            f"the config differs from {saved_path} where a continued run must keep it:\n"
            f"{describe_differences(unsafe)}\n(trainer.stages, trainer.max_generated_tokens, "
            "logging, validation, saving and output may change; --force goes on anyway)"
        )
    if from_checkpoint is not None:
        output_dir = output_dir or output_dir_for(wanted, None)
        seed_checkpoint(from_checkpoint, output_dir)
    return wanted, output_dir


def positional(config: Path | PositionalOverride | None) -> list[str]:
    """A KEY=VALUE given where CONFIG goes, as an override."""
    return [str(config)] if isinstance(config, PositionalOverride) else []


def fetch_saved_config(
    run_dir: Path,
    config: Path | PositionalOverride | None,
    set_: list[str] | None,
    overrides: list[str] | None,
) -> bool:
    """`run_dir`'s saved config downloaded from the `output.storage` that CONFIG and the
    overrides name (a resume on a node that never held the run); whether it was there."""
    from satseq.cluster.checkpoint import run_storage

    storage = run_storage(run_dir, resolve_config(config, set_, overrides).output.storage)
    return storage is not None and storage.fetch(run_dir / TRAIN_CONFIG)


def checkpoint_run(checkpoint: Path) -> Path:
    """RUN of `RUN/checkpoints/stage_N`, a complete checkpoint; else a clean exit saying why."""
    from satseq.cluster.checkpoint import RUN_STATE, STAGE_PATTERN

    if not (STAGE_PATTERN.match(checkpoint.name) and checkpoint.parent.name == "checkpoints"):
        raise fail(f"--from-checkpoint {checkpoint}: expected RUN/checkpoints/stage_<N>")
    if not (checkpoint / RUN_STATE).is_file():
        raise fail(f"--from-checkpoint {checkpoint}: not a complete checkpoint (no {RUN_STATE})")
    return checkpoint.parent.parent


def seed_checkpoint(checkpoint: Path, output_dir: Path) -> None:
    """`checkpoint` copied into the new run's checkpoints/, where resume finds it; a directory
    that already holds a run is refused."""
    import shutil

    target = output_dir / "checkpoints"
    if (output_dir / TRAIN_CONFIG).exists() or target.exists():
        raise fail(f"--output-dir {output_dir} already holds a run: give a new directory")
    shutil.copytree(checkpoint, target / checkpoint.name)


def output_dir_for(config: RunConfig, output_dir: Path | None) -> Path:
    return output_dir or Path(config.output.dir) / config.output.exp_name


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
    from satseq.cluster.checkpoint import checkpoint_stages, run_storage

    out = output_dir_for(config, output_dir)
    stages = checkpoint_stages(out / "checkpoints", run_storage(out, config.output.storage))
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
