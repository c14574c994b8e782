"""The `satseq` command (DESIGN §10). Each subcommand is a thin shell over a library call."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from satseq.config import ConfigError, dump_config, load_config
from satseq.offline.cli import offline_values_app

app = typer.Typer(
    help="satseq: RL post-training of LLM teams (SAT-Seq, SPO, GRPO) on Ray, and serving the team.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the run configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")
sandbox_app = typer.Typer(help="The code sandbox.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
model_app = typer.Typer(help="Models: the embedded tiny model.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(offline_values_app, name="offline-values")

errors = Console(stderr=True, soft_wrap=True)

ConfigArg = Annotated[
    Path | None,
    typer.Argument(help="YAML config; default configs/quickstart.yaml", show_default=False),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a key: --set trainer.stages=4 (repeatable)"),
]


def fail(message: str) -> typer.Exit:
    """Print a user-facing error and return the exit to raise (status 2: bad input)."""
    errors.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    return typer.Exit(code=2)


def resolve_config(config: Path | None, overrides: list[str] | None):
    """The resolved RunConfig, or a clean exit naming what is wrong."""
    try:
        return load_config(config, overrides or [])
    except ConfigError as err:
        raise fail(str(err)) from None


@config_app.command("show")
def config_show(config: ConfigArg = None, set_: SetOption = None) -> None:
    """Print the resolved config as YAML: the file, then every --set override, then defaults."""
    typer.echo(dump_config(resolve_config(config, set_)), nl=False)


@app.command("train")
def train(
    config: ConfigArg = None,
    set_: SetOption = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue after the last checkpoint")
    ] = False,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="default: output.dir/output.exp_name")
    ] = None,
    address: Annotated[
        str | None,
        typer.Option("--address", help="Ray cluster address (default $RAY_ADDRESS, else local)"),
    ] = None,
) -> None:
    """Train the team; with no CONFIG, the embedded default (configs/quickstart.yaml)."""
    resolved = resolve_config(config, set_)  # before the heavy imports: errors come at once
    from satseq.cluster.driver import train as run_training

    run_training(resolved, str(output_dir) if output_dir else None, resume=resume, address=address)


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


@app.command("eval")
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
    set_: SetOption = None,
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address")] = None,
) -> None:
    """Score the team: K samples per agent per problem, the team's vote, pass@k/avg@k/maj@k.

    The config is the checkpoint dir's train_config.yaml (else the quickstart's) plus --set.
    """
    from satseq.data import DataError
    from satseq.evaluation import CheckpointError, summary_table
    from satseq.evaluation.runner import run_evaluation

    config = resolve_config_for(checkpoint_dir, set_)
    try:
        _, summary = run_evaluation(
            config, dataset, checkpoint_dir, output_dir, samples_per_agent, stage, address
        )
    except (DataError, CheckpointError) as err:
        raise fail(str(err)) from None
    Console().print(summary_table(summary))
    typer.echo(f"outputs: {output_dir}")


@app.command("serve")
def serve_team(
    checkpoint_dir: CheckpointDirOption,
    port: Annotated[int | None, typer.Option(help="HTTP port (default serve.port)")] = None,
    samples_per_agent: Annotated[
        int | None, typer.Option("--samples-per-agent", min=1, help="default K per request")
    ] = None,
    stage: StageOption = None,
    serve_config: Annotated[
        Path | None,
        typer.Option(
            "--serve-config", help="Ray Serve config for scaling; default configs/serve.yaml"
        ),
    ] = None,
    set_: SetOption = None,
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address")] = None,
) -> None:
    """Serve the team over HTTP (Ray Serve): POST /predict, GET /health, /metrics, /docs."""
    from satseq.evaluation import CheckpointError
    from satseq.serving.app import ServeConfigError, run_server

    config = resolve_config_for(checkpoint_dir, set_)
    try:
        run_server(config, checkpoint_dir, port, samples_per_agent, stage, serve_config, address)
    except (CheckpointError, ServeConfigError) as err:
        raise fail(str(err)) from None


def resolve_config_for(checkpoint_dir: Path, overrides: list[str] | None):
    """The team's training config (else the quickstart's) with --set overrides, or a clean exit."""
    from satseq.evaluation.runner import run_config_for

    try:
        return run_config_for(checkpoint_dir, overrides or [])
    except ConfigError as err:
        raise fail(str(err)) from None


@model_app.command("build-tiny")
def model_build_tiny(
    out: Annotated[Path, typer.Option("--out", help="directory to write the HF model into")],
    size: Annotated[str, typer.Option(help="quickstart | 50m (random init)")] = "quickstart",
    variant: Annotated[str, typer.Option(help="steps | tool (warm-started on tool use)")] = "steps",
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


@sandbox_app.command("serve")
def sandbox_serve(
    config: ConfigArg = None,
    set_: SetOption = None,
    port: Annotated[int, typer.Option(help="port of the /run_code server")] = 8080,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
) -> None:
    """A SandboxFusion-compatible /run_code server (plus /v1/ping) on the local sandbox."""
    import logging

    from satseq.sandbox.backend import local_settings
    from satseq.sandbox.isolation import SandboxUnavailable
    from satseq.sandbox.server import serve

    resolved = resolve_config(config, set_)
    logging.basicConfig(level=logging.INFO)  # shows the active isolation layers
    try:
        serve(local_settings(resolved.sandbox), host=host, port=port)
    except SandboxUnavailable as err:
        raise fail(str(err)) from None


@app.command("report")
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


def main() -> None:
    app()
