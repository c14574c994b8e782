"""`satseq model ...`: the embedded tiny model, and LoRA adapters merged into full models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from satseq.cli.common import fail

model_app = typer.Typer(
    help="Models: the embedded tiny model; merging a LoRA adapter.", no_args_is_help=True
)


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
    """Build the embedded tiny Qwen2 model (tokenizer, chat template, warm start); a builtin
    model's settings (the defaults: builtin:tiny's) are copied from the model cache."""
    from satseq.models import TinyModelError, build_tiny_model

    try:
        path = build_tiny_model(
            out, size=size, variant=variant, seed=seed, warm_start_steps=warm_start_steps
        )
    except TinyModelError as err:
        raise fail(str(err)) from None
    typer.echo(f"built {path}")


@model_app.command("merge-lora")
def model_merge_lora(
    adapter_dir: Annotated[
        Path, typer.Argument(help="a LoRA agent's adapter dir (agent_<name>/stage_<k>/)")
    ],
    out: Annotated[Path, typer.Option("--out", help="directory to write the merged HF model")],
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16")] = "float32",
) -> None:
    """Merge a LoRA adapter into its base: a full HF model directory (transformers, vLLM)."""
    from satseq.models import ModelLoadError, is_adapter_dir
    from satseq.models.adapters import merge_adapter

    if not is_adapter_dir(adapter_dir):
        raise fail(f"{adapter_dir} is not a LoRA adapter directory (it has no adapter_config.json)")
    try:
        path = merge_adapter(adapter_dir, out, dtype)
    except (ModelLoadError, OSError) as err:
        raise fail(str(err)) from None
    typer.echo(f"merged {adapter_dir} into {path}")
