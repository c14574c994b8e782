"""Requests generated from the app's own OpenAPI schema, valid and invalid: none gets a 5xx.

Two route groups: /predict (with /health and /metrics), whose invalid bodies get 422, and the
OpenAI-compatible /v1 routes, whose invalid bodies get 400. A generated `model` is any string
(an unknown model: 404), so half the /v1 bodies name a served model instead, and reach the
agents with generated sampling settings, stop strings and conversations.
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.serving.replicas import TEAM

pytestmark = pytest.mark.slow
SERVED_MODELS = st.sampled_from([None, "team", *TEAM])  # None: keep the generated name


@pytest.mark.parametrize(
    ("routes", "refusal"), [("^/(?!v1/)", 422), ("^/v1/", 400)], ids=["predict", "openai"]
)
@pytest.mark.parametrize(
    ("mode", "examples"), [(GenerationMode.POSITIVE, 12), (GenerationMode.NEGATIVE, 20)]
)
def test_no_generated_request_gets_a_server_error(server, routes, refusal, mode, examples):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json").include(path_regex=routes)
    statuses = []

    @given(case=schema.as_strategy(mode), model=SERVED_MODELS)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case, model):
        if model is not None and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = model
        response = case.call(base_url=server.url, headers=server.headers, timeout=120)
        statuses.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    check()
    assert statuses and max(statuses) < 500
    if mode == GenerationMode.NEGATIVE:
        assert refusal in statuses  # invalid bodies were sent, and refused as such
