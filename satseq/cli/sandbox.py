"""`satseq sandbox ...`: the code sandbox."""

from __future__ import annotations

from typing import Annotated

import typer

from satseq.cli.common import ConfigArg, SetOption, fail, resolve_config

sandbox_app = typer.Typer(help="The code sandbox.", no_args_is_help=True)


@sandbox_app.command("serve")
def sandbox_serve(
    config: ConfigArg = None,
    set_: SetOption = None,
    port: Annotated[int, typer.Option(help="port of the /run_code server")] = 8080,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
) -> None:
    """A SandboxFusion-compatible /run_code server (plus /v1/ping) on the local sandbox."""
    import logging

    from satseq.launch.settings import local_sandbox_settings
    from satseq.sandbox.isolation import SandboxUnavailable
    from satseq.sandbox.server import serve

    resolved = resolve_config(config, set_)
    logging.basicConfig(level=logging.INFO)  # shows the active isolation layers
    try:
        serve(local_sandbox_settings(resolved.sandbox), host=host, port=port)
    except SandboxUnavailable as err:
        raise fail(str(err)) from None
