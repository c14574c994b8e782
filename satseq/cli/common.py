"""What every subcommand shares: user-facing errors, config resolution, common options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from satseq.config import ConfigError, RunConfig, load_config

errors = Console(stderr=True, soft_wrap=True)


class PositionalOverride(str):
    """A KEY=VALUE where CONFIG goes (`satseq train trainer.stages=4`): an override, not a file."""


def parse_config_argument(text: str) -> Path | PositionalOverride:
    """CONFIG, unless it is KEY=VALUE and no such file exists (Hydra's rule: `=` marks an
    override). The text of an override is kept as typed: a Path would fold `s3://` into `s3:/`."""
    if "=" in text and not Path(text).exists():
        return PositionalOverride(text)
    return Path(text)


ConfigArg = Annotated[
    Path | None,
    typer.Argument(
        parser=parse_config_argument,
        metavar="CONFIG",
        help="YAML config; default configs/quickstart.yaml",
        show_default=False,
    ),
]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="KEY=VALUE",
        help="overrides after CONFIG, Hydra style (trainer.stages=4 data.split=test); "
        "applied before the --set ones",
        show_default=False,
    ),
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
        help="run the tool loop (design §5) with the sandbox pool and the tool prompt, as "
        "rollout.tools.enabled=true does (on by default for a team trained with tools)",
    ),
]


def fail(message: str) -> typer.Exit:
    """Print a user-facing error and return the exit to raise (status 2: bad input)."""
    # escaped: messages quote user text, and `[a, b` or `['train']` is not markup
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True)
    return typer.Exit(code=2)


def resolve_config(
    config: Path | PositionalOverride | None,
    set_overrides: list[str] | None,
    overrides: list[str] | None = None,
) -> RunConfig:
    """The resolved RunConfig: CONFIG, the KEY=VALUE `overrides`, then the --set ones; or a
    clean exit naming what is wrong."""
    config, ordered = config_and_overrides(config, overrides, set_overrides)
    try:
        return load_config(config, ordered)
    except ConfigError as err:
        raise fail(str(err)) from None


def config_and_overrides(
    config: Path | PositionalOverride | None,
    overrides: list[str] | None,
    set_overrides: list[str] | None,
) -> tuple[Path | None, list[str]]:
    """(the config file, every override in the order applied): a KEY=VALUE in CONFIG's place
    (`satseq train trainer.stages=4`, no file) is the first override."""
    ordered = [*(overrides or []), *(set_overrides or [])]
    if isinstance(config, PositionalOverride):
        return None, [str(config), *ordered]
    return config, ordered


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
