"""Requests generated from the app's own OpenAPI schema, valid and invalid: none gets a 5xx."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("mode", "examples"), [(GenerationMode.POSITIVE, 12), (GenerationMode.NEGATIVE, 20)]
)
def test_no_generated_request_gets_a_server_error(server, mode, examples):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    statuses = []

    @given(case=schema.as_strategy(mode))
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        response = case.call(base_url=server.url, headers=server.headers, timeout=120)
        statuses.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    check()
    assert statuses and max(statuses) < 500
    if mode == GenerationMode.NEGATIVE:
        assert 422 in statuses  # invalid bodies were sent, and refused as such
