"""`satseq sandbox serve`: a SandboxFusion-compatible HTTP server on the local backend.

It answers `POST /run_code` (SandboxFusion's schema, see fusion_api.py) and `GET /v1/ping`,
so that any SandboxFusion client, ours included, can use this machine's sandbox. A request
the sandbox cannot take (an unknown language, bad base64, a limit out of range, a path that
leaves the working directory) gets 422 with a message saying what is wrong.
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI, HTTPException

from satseq.sandbox.backend import SandboxBackend
from satseq.sandbox.fusion_api import (
    RunCodeRequest,
    RunCodeResponse,
    from_fusion_request,
    to_fusion_response,
)
from satseq.sandbox.local import LocalBackend, LocalSandboxSettings


def create_app(backend: SandboxBackend) -> FastAPI:
    """The web app around `backend`; the caller starts and closes the backend."""
    app = FastAPI(title="satseq sandbox", description="SandboxFusion-compatible /run_code")

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.post("/run_code")
    async def run_code(payload: RunCodeRequest) -> RunCodeResponse:
        try:
            request = from_fusion_request(payload)
        except ValueError as error:
            raise HTTPException(status_code=422, detail=str(error)) from None
        return to_fusion_response(await backend.execute(request))

    return app


def serve(settings: LocalSandboxSettings, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Start the local backend and serve it until interrupted; then stop every slot.

    Raises:
        SandboxUnavailable: the backend is below `settings.min_isolation`, or cannot start.
    """
    with LocalBackend(settings) as backend:
        uvicorn.run(create_app(backend), host=host, port=port, log_level="info")
