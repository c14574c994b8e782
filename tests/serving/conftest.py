"""One served team for the package: `satseq serve`'s path on a free local port, with an API key.

Besides the main application (configs/serve.yaml's a0, a1, a2, all builtin:tiny copies), two
small applications share its agent deployments through their handles:
- /faulty: agent a0 plus `broken`, a checkpoint whose embedding is smaller than its
  tokenizer's vocabulary, so its engine fails on every prompt (as a corrupt checkpoint would);
- /slow: agent a0 behind an ingress whose per-request timeout nothing can meet.

`resilient_server` serves the same team again as its own application (/resilient), with fixed
replicas (REPLICAS: two of a0, one of a1 and a2), for the tests that kill replicas and measure
memory.
"""

import os
import shutil
from dataclasses import dataclass

import pytest
import ray
from ray import serve
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from satseq.config import load_config
from satseq.launch.settings import prompt_format, reward_scorer
from satseq.models import resolve_model_path
from satseq.serving.agent import AgentDeployment
from satseq.serving.app import (
    AGENT_PREFIX,
    INGRESS,
    PROXY_ENV,
    serve_settings,
    start_server,
    team_app,
)
from satseq.serving.ingress import TeamIngress
from tests.cluster.runs import free_port
from tests.serving.replicas import REPLICAS, RESILIENT_APP, TEAM

API_KEY_ENV = "SATSEQ_TEST_API_KEY"
API_KEY = "test-key-123"
LIGHT = {"ray_actor_options": {"num_cpus": 0.05}}


@dataclass(frozen=True)
class Server:
    url: str
    headers: dict[str, str]
    team_dir: str  # the agents' HF dirs


def team_config():
    return load_config(overrides=[f"serve.api_key_env={API_KEY_ENV}"])


def broken_model(path):
    """builtin:tiny's tokenizer on a model with an 8-token embedding: loads, cannot generate."""
    tiny = resolve_model_path("builtin:tiny")
    config = AutoConfig.from_pretrained(tiny)
    config.vocab_size = 8
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(path)
    return path


@pytest.fixture(scope="package")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    tiny = resolve_model_path("builtin:tiny")
    for name in TEAM:  # per-agent HF dirs
        shutil.copytree(tiny, root / "team" / name)
    broken = broken_model(root / "broken")
    os.environ[API_KEY_ENV] = API_KEY  # before ray.init: replicas inherit it
    os.environ.update(PROXY_ENV)  # as `start_server` sets it when it starts Ray itself
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        config = team_config()
        url = start_server(config, root / "team", port=free_port())
        a0 = serve.get_deployment_handle("agent_a0", app_name="satseq")
        settings = serve_settings(config, {"checkpoint_dir": str(root / "team")})
        scorer = reward_scorer(config)
        problem_format = prompt_format(config)
        broken_agent = AgentDeployment.options(name="agent_broken", **LIGHT).bind(
            str(broken), scorer, "hf", {}, 0
        )
        paths = {"a0": str(root / "team" / "a0"), "broken": str(broken)}
        faulty = TeamIngress.options(**LIGHT).bind(
            {"a0": a0, "broken": broken_agent}, paths, problem_format, scorer, settings
        )
        serve.run(faulty, name="faulty", route_prefix="/faulty")
        slow_settings = settings.model_copy(update={"timeout_s": 1e-4})
        slow = TeamIngress.options(**LIGHT).bind(
            {"a0": a0}, {"a0": paths["a0"]}, problem_format, scorer, slow_settings
        )
        serve.run(slow, name="slow", route_prefix="/slow")
        yield Server(url, {"Authorization": f"Bearer {API_KEY}"}, str(root / "team"))
    finally:
        serve.shutdown()
        ray.shutdown()
        for name in (API_KEY_ENV, *PROXY_ENV):
            os.environ.pop(name, None)


@pytest.fixture(scope="package")
def resilient_server(server):
    """The team built by `team_app` as application RESILIENT_APP, REPLICAS of each agent."""
    config = team_config()
    settings = serve_settings(config, {"checkpoint_dir": server.team_dir})
    options = {
        INGRESS: LIGHT,
        **{AGENT_PREFIX + name: {"num_replicas": REPLICAS[name], **LIGHT} for name in TEAM},
    }
    route = f"/{RESILIENT_APP}"
    serve.run(team_app(config, settings, options), name=RESILIENT_APP, route_prefix=route)
    try:
        yield Server(server.url + route, server.headers, server.team_dir)
    finally:
        serve.delete(RESILIENT_APP)
