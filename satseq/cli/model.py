"""`satseq model ...`: the embedded tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from satseq.cli.common import fail

model_app = typer.Typer(help="Models: the embedded tiny model.", no_args_is_help=True)


@model_app.command("build-tiny")
def model_build_tiny(
    out: Annotated[Path, typer.Option("--out", help="directory to write the HF model into")],
    size: Annotated[str, typer.Option(help="quickstart | 50m (random init)")] = "quickstart",
    variant: Annotated[
        str, typer.Option(help="steps | tool (tool use) | carry (two_digit_sums, perfect teacher)")
    ] = "steps",
    seed: int = 0,
    warm_start_steps: Annotated[int | None, typer.Option(help="override the size's steps")] = None,
) -> None:
    """Build the embedded tiny Qwen2 model (tokenizer, chat template, warm start)."""
    from satseq.models import TinyModelError, build_tiny_model

    try:
        path = build_tiny_model(
            out, size=size, variant=variant, seed=seed, warm_start_steps=warm_start_steps
        )
    except TinyModelError as err:
        raise fail(str(err)) from None
    typer.echo(f"built {path}")
