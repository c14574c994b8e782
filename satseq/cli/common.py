"""What every subcommand shares: user-facing errors, config resolution, common options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from satseq.config import ConfigError, RunConfig, load_config

errors = Console(stderr=True, soft_wrap=True)

ConfigArg = Annotated[
    Path | None,
    typer.Argument(help="YAML config; default configs/quickstart.yaml", show_default=False),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a key: --set trainer.stages=4 (repeatable)"),
]
AddressOption = Annotated[
    str | None,
    typer.Option("--address", help="Ray cluster address (default $RAY_ADDRESS, else local)"),
]
CheckpointDirOption = Annotated[
    Path,
    typer.Option(
        "--checkpoint-dir",
        help="training output dir (agent_<name>/stage_<k>/) or a dir of per-agent HF model dirs",
    ),
]
StageOption = Annotated[
    int | None, typer.Option("--stage", help="use stage K of every agent (default: the latest)")
]
ToolsOption = Annotated[
    bool,
    typer.Option(
        "--tools",
        help="run the tool loop (DESIGN §5) with the sandbox pool and the tool prompt, as "
        "rollout.tools.enabled=true does (on by default for a team trained with tools)",
    ),
]


def fail(message: str) -> typer.Exit:
    """Print a user-facing error and return the exit to raise (status 2: bad input)."""
    errors.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    return typer.Exit(code=2)


def resolve_config(config: Path | None, overrides: list[str] | None) -> RunConfig:
    """The resolved RunConfig, or a clean exit naming what is wrong."""
    try:
        return load_config(config, overrides or [])
    except ConfigError as err:
        raise fail(str(err)) from None


def resolve_config_for(
    checkpoint_dir: Path, overrides: list[str] | None, tools: bool = False
) -> RunConfig:
    """The team's training config (else the quickstart's) with --tools and --set overrides, or
    a clean exit."""
    from satseq.config import run_config_for

    try:
        return run_config_for(checkpoint_dir, overrides or [], tools)
    except ConfigError as err:
        raise fail(str(err)) from None
