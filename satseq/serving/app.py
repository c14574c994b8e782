"""The Ray Serve application: its graph, built in one function, and how `satseq serve` runs it.

The same graph runs three ways:
- `satseq serve --checkpoint-dir DIR`: `start_server`, with scaling read from configs/serve.yaml;
- `serve run configs/serve.yaml` or `serve deploy`: Ray calls `build_app(args)`;
- a KubeRay RayService (deploy/rayservice.yaml), whose serveConfigV2 is configs/serve.yaml.

Deployments are named `agent_<name>` (one per agent with a model of its own), `lora_base_<k>`
(one per base of LoRA agents, k counting the bases in agent order: one engine with every
adapter, design §12) and `TeamIngress`; configs/serve.yaml sets their replicas and autoscaling
by those names.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from ray import serve
from ray.serve import Application

from satseq.config import RunConfig, run_config_for
from satseq.config.load import SERVE_CONFIG, format_validation_error
from satseq.config.schema import ServeConfig
from satseq.evaluation.checkpoints import resolve_team
from satseq.launch.agent_models import trust_team
from satseq.launch.connection import connect
from satseq.launch.settings import prompt_format, reward_scorer
from satseq.models import is_adapter_dir
from satseq.models.adapters import adapter_base
from satseq.seeds import agent_seed
from satseq.serving.agent import AgentDeployment
from satseq.serving.ingress import TeamIngress

log = logging.getLogger(__name__)

INGRESS = "TeamIngress"
AGENT_PREFIX = "agent_"
LORA_BASE_PREFIX = "lora_base_"
PROXY_ENV = {"RAY_SERVE_PROXY_USE_GRPC": "1", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}
"""Serve's HTTP proxy hands each request to the ingress over gRPC instead of as a Ray actor
call: about 2 ms less per request on a busy 2-core machine. Serve's controller gives a starting
proxy 5 s to answer its first ready check and otherwise kills it, which fails `serve.start` on a
loaded machine (CI, where the proxy's imports alone can take longer): 60 s instead. Ray's
processes read both when they start, so they apply to a Ray instance `start_server` starts; on a
cluster, set them in the Ray nodes' environment."""


class ServeConfigError(ValueError):
    """configs/serve.yaml or the serve settings are wrong; the message names the key."""


def team_app(
    config: RunConfig,
    settings: ServeConfig,
    deployment_options: dict[str, dict[str, Any]] | None = None,
) -> Application:
    """The graph: an AgentDeployment per agent of `settings.checkpoint_dir` (per base for its
    LoRA agents, `deployment_groups`), bound into the TeamIngress. `deployment_options` (by
    deployment name) are Ray Serve deployment options; names the team lacks are ignored with a
    warning (`serve run` would refuse them). With `rollout.tools.enabled` each agent answers
    through the tool loop (`rollout.tools`, `sandbox`), as in training."""
    if not settings.checkpoint_dir:
        raise ServeConfigError("serve.checkpoint_dir is not set: pass --checkpoint-dir")
    options = dict(deployment_options or {})
    team = resolve_team(settings.checkpoint_dir, settings.stage)
    scorer = reward_scorer(config)
    tools = config.rollout.tools if config.rollout.tools.enabled else None
    seeds = {name: agent_seed(settings.seed, k) for k, name in enumerate(team.agent_paths)}
    agents = {}
    for deployment, paths in deployment_groups(team.agent_paths).items():
        shared = deployment.startswith(LORA_BASE_PREFIX)
        handle = AgentDeployment.options(name=deployment, **options.pop(deployment, {})).bind(
            paths if shared else next(iter(paths.values())),
            scorer,
            settings.engine,
            {
                "num_threads": settings.engine_threads,
                "fp32_head": config.trainer.fp32_head,
                "dtype": settings.dtype,
            },
            {name: seeds[name] for name in paths} if shared else seeds[next(iter(paths))],
            tools,
            config.sandbox,
        )
        agents |= dict.fromkeys(paths, handle)
    deployments = [INGRESS, *deployment_groups(team.agent_paths)]
    ingress = TeamIngress.options(name=INGRESS, **options.pop(INGRESS, {}))
    if options:
        log.warning(
            "the serve config sets deployments %s, which this team does not have (its "
            "deployments are %s): ignored; agents without settings get Ray Serve's defaults",
            sorted(options),
            deployments,
        )
    return ingress.bind(
        agents,
        {name: str(path) for name, path in team.agent_paths.items()},
        prompt_format(config),
        scorer,
        settings,
    )


def deployment_groups(agent_paths: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Deployment name → the agents it serves (name → directory), in agent order:
    `agent_<name>` for a full model, `lora_base_<k>` for the LoRA agents on the k-th base."""
    groups: dict[str, dict[str, str]] = {}
    bases: list[Path] = []
    for name, path in agent_paths.items():
        if not is_adapter_dir(path):
            groups[f"{AGENT_PREFIX}{name}"] = {name: str(path)}
            continue
        base = adapter_base(path)
        if base not in bases:
            bases.append(base)
        groups.setdefault(f"{LORA_BASE_PREFIX}{bases.index(base)}", {})[name] = str(path)
    return groups


def build_app(args: dict[str, Any]) -> Application:
    """Ray Serve's application builder (`import_path: satseq.serving.app:build_app`).

    `args` are `serve` settings (ServeConfig fields, `checkpoint_dir` required) and optionally
    `tools: true` (as `satseq serve --tools`); the prompt format, reward and tool use come from
    the checkpoint dir's train_config.yaml, as in `satseq eval`. Scaling comes from the Serve
    config's `deployments`, which Ray applies itself.
    """
    args = dict(args)
    tools = bool(args.pop("tools", False))
    checkpoint_dir = args.get("checkpoint_dir")
    if not checkpoint_dir:
        raise ServeConfigError("args.checkpoint_dir is required")
    config = run_config_for(checkpoint_dir, [], tools)
    return team_app(config, serve_settings(config, args))


def serve_settings(config: RunConfig, args: dict[str, Any]) -> ServeConfig:
    """The config's `serve` section with `args` on top."""
    try:
        return ServeConfig.model_validate(config.serve.model_dump() | args)
    except ValidationError as error:
        raise ServeConfigError(format_validation_error(error, "serve settings")) from None


def read_serve_config(path: str | Path = SERVE_CONFIG) -> dict[str, Any]:
    """The one application of a Ray Serve config file, checked for what `satseq serve` needs."""
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ServeConfigError(f"{path}: cannot read the Serve config: {error}") from None
    applications = (spec or {}).get("applications") if isinstance(spec, dict) else None
    if not isinstance(applications, list) or len(applications) != 1:
        raise ServeConfigError(f"{path}: expected `applications:` with exactly one application")
    application = applications[0]
    if not isinstance(application.get("deployments", []), list):
        raise ServeConfigError(f"{path}: applications[0].deployments must be a list")
    return application


def deployment_options(application: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Deployment name → its options (everything but `name`), from a Serve config application."""
    return {
        d["name"]: {key: value for key, value in d.items() if key != "name"}
        for d in application.get("deployments", [])
    }


def start_server(
    config: RunConfig,
    checkpoint_dir: str | Path,
    port: int | None = None,
    samples_per_agent: int | None = None,
    stage: int | None = None,
    serve_config: str | Path | None = None,
    address: str | None = None,
    host: str | None = None,
) -> str:
    """Deploy the team (scaling from `serve_config`, default configs/serve.yaml) and return the
    base URL once every deployment is up. Host and port: `--host`/`serve.host`,
    `--port`/`serve.port` (the Serve config's http_options are for clusters)."""
    application = read_serve_config(serve_config or SERVE_CONFIG)
    flags = {"checkpoint_dir": str(checkpoint_dir), "stage": stage}
    if samples_per_agent is not None:
        flags["samples_per_agent"] = samples_per_agent
    if host is not None:
        flags["host"] = host
    settings = serve_settings(config, application.get("args", {}) | flags)
    app = team_app(config, settings, deployment_options(application))
    for name, value in PROXY_ENV.items():  # before `connect` starts Ray: its processes inherit
        os.environ.setdefault(name, value)
    trust_team(config, checkpoint_dir)
    connect(address)
    port = port or settings.port
    serve.start(http_options={"host": settings.host, "port": port})
    serve.run(
        app,
        name=application.get("name", "satseq"),
        route_prefix=application.get("route_prefix", "/"),
    )
    return f"http://{settings.host}:{port}"


def run_server(*args: Any, **kwargs: Any) -> None:
    """`start_server`, then serve until Ctrl-C."""
    url = start_server(*args, **kwargs)
    print(f"serving the team at {url}  (POST /predict, GET /health, /metrics, /docs); Ctrl-C stops")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
