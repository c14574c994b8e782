"""Serving the trained team with Ray Serve: per-agent deployments and a voting ingress (DESIGN §7).

    satseq serve --checkpoint-dir outputs/quickstart --port 8000
    curl -X POST localhost:8000/predict -H 'content-type: application/json' \\
         -d '{"problem": "Compute 3 + 4."}'
"""

from satseq.serving.app import (
    ServeConfigError,
    build_app,
    read_serve_config,
    run_server,
    start_server,
    team_app,
)

__all__ = [
    "ServeConfigError",
    "build_app",
    "read_serve_config",
    "run_server",
    "start_server",
    "team_app",
]
