"""A team served with tools (design §5, §7): each agent answers through training's tool loop,
its code run by its replica's sandbox pool, and `return_trajectories: true` shows the turns.

The team is one agent, t0, a copy of builtin:tiny-tool (the tiny model warm-started on
sandbox traces), served as its own application (/tools) beside the package's server with
configs/quickstart_tools.yaml as its config. Asked a problem it memorised, greedily, it writes
`<code>print(a+b)</code>`, reads the interpreter's output, and answers `\\boxed{…}`.
"""

import shutil
from pathlib import Path

import httpx
import pytest
from ray import serve

from satseq.config import load_config
from satseq.data import make_split
from satseq.models import resolve_model_path
from satseq.serving.app import AGENT_PREFIX, INGRESS, serve_settings, team_app
from tests.serving.conftest import API_KEY_ENV, LIGHT

pytestmark = pytest.mark.slow

TOOLS_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart_tools.yaml"
TOOLS_APP = "tools"


@pytest.fixture(scope="module")
def tool_server(server, tmp_path_factory):
    team_dir = tmp_path_factory.mktemp("tool-team")
    shutil.copytree(resolve_model_path("builtin:tiny-tool"), team_dir / "t0")
    config = load_config(TOOLS_CONFIG, [f"serve.api_key_env={API_KEY_ENV}"])
    settings = serve_settings(config, {"checkpoint_dir": str(team_dir)})
    options = {INGRESS: LIGHT, f"{AGENT_PREFIX}t0": LIGHT}
    route = f"/{TOOLS_APP}"
    serve.run(team_app(config, settings, options), name=TOOLS_APP, route_prefix=route)
    try:
        yield server.url + route, server.headers
    finally:
        serve.delete(TOOLS_APP)


def predict(tool_server, **body):
    url, headers = tool_server
    response = httpx.post(url + "/predict", json=body, headers=headers, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_predict_returns_each_agents_tool_turns(tool_server):
    problem = make_split("train", 1, style="symbols")[0]
    body = predict(
        tool_server, problem=problem.problem, temperature=0, max_tokens=64, return_trajectories=True
    )
    ((sample,),) = body["trajectories"].values()
    first = sample["turns"][0]
    assert first["code"] and first["code"][0].startswith("print(")  # the model's code ...
    # ... ran in the sandbox, and its output was spliced in for the model to read
    assert sample["tool_statuses"][0] == "ok"
    assert first["interpreter"].startswith("<interpreter>\n")
    assert "<interpreter>" in sample["response"] and len(sample["turns"]) >= 2
    assert body["individual_answers"]["t0"] == [sample["answer"]]


def test_trajectories_only_when_asked(tool_server):
    problem = make_split("train", 1, style="symbols")[0]
    body = predict(tool_server, problem=problem.problem, temperature=0, max_tokens=64)
    assert body["trajectories"] is None and body["agents"] == ["t0"]
