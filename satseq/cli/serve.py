"""`satseq serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from satseq.cli.common import (
    AddressOption,
    CheckpointDirOption,
    SetOption,
    StageOption,
    ToolsOption,
    fail,
    resolve_config_for,
)


def serve_team(
    checkpoint_dir: CheckpointDirOption,
    port: Annotated[int | None, typer.Option(help="HTTP port (default serve.port)")] = None,
    host: Annotated[
        str | None,
        typer.Option(
            help="address to listen on, e.g. 0.0.0.0 for every interface (default "
            "serve.host, 127.0.0.1)"
        ),
    ] = None,
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
    tools: ToolsOption = False,
    set_: SetOption = None,
    address: AddressOption = None,
) -> None:
    """Serve the team over HTTP (Ray Serve): POST /predict, GET /health, /metrics, /docs.

    A request's max_tokens defaults to (and is bounded by) the budget the team was trained with,
    rollout.max_new_tokens of its train_config.yaml; --set serve.max_tokens=N sets another.

    With tools (the config's rollout.tools.enabled, or --tools) each agent answers through the
    tool loop on a sandbox pool; `return_trajectories: true` shows each sample's tool turns.
    """
    from satseq.evaluation import CheckpointError
    from satseq.serving.app import ServeConfigError, run_server

    config = resolve_config_for(checkpoint_dir, set_, tools)
    try:
        run_server(
            config, checkpoint_dir, port, samples_per_agent, stage, serve_config, address, host
        )
    except (CheckpointError, ServeConfigError) as err:
        raise fail(str(err)) from None
