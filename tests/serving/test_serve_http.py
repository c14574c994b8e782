"""The served team over HTTP: /predict, /health, /metrics, /docs, and every refusal."""

import httpx
import pytest

from tests.serving.load import metric_samples

pytestmark = pytest.mark.slow
PROBLEM = {"problem": "Compute 3 + 4."}


def post(server, body, path="/predict", **kwargs):
    kwargs.setdefault("headers", server.headers)
    return httpx.post(server.url + path, json=body, timeout=120, **kwargs)


def test_predict_returns_the_teams_vote(server):
    response = post(server, {**PROBLEM, "samples_per_agent": 2, "temperature": 0.8})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) >= {
        "predicted_answer",
        "individual_answers",
        "votes",
        "agreement",
        "agents",
        "latency_ms",
        "degraded",
    }
    assert body["agents"] == ["a0", "a1", "a2"] and body["degraded"] is False
    assert [len(body["individual_answers"][a]) for a in body["agents"]] == [2, 2, 2]
    cast = [a for answers in body["individual_answers"].values() for a in answers if a]
    assert sum(body["votes"].values()) == len(cast)
    if cast:
        winner_votes = max(body["votes"].values())
        assert body["votes"][body["predicted_answer"]] == winner_votes
        assert body["agreement"] == pytest.approx(winner_votes / len(cast))
    assert body["latency_ms"] > 0


def test_greedy_copies_agree(server):
    body = post(server, {"problem": "Compute 12 + 7.", "temperature": 0}).json()
    answers = [a for answers in body["individual_answers"].values() for a in answers]
    assert len(set(answers)) == 1 and len(answers) == 3  # default samples_per_agent: 1
    if answers[0] is not None:
        assert body["agreement"] == 1.0 and body["predicted_answer"] == answers[0]


def test_health_docs_and_openapi_bounds(server):
    health = httpx.get(server.url + "/health", timeout=30)
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "agents": {"a0": True, "a1": True, "a2": True}}
    assert httpx.get(server.url + "/docs", timeout=30).status_code == 200
    schema = httpx.get(server.url + "/openapi.json", timeout=30).json()
    request = schema["components"]["schemas"]["PredictRequest"]["properties"]
    assert request["samples_per_agent"]["anyOf"][0]["maximum"] == 16
    assert request["max_tokens"]["anyOf"][0]["maximum"] == 256


def test_a_request_without_the_api_key_gets_401(server):
    assert post(server, PROBLEM, headers={}).status_code == 401
    wrong = post(server, PROBLEM, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "API key" in wrong.json()["detail"]
    assert wrong.headers["www-authenticate"] == "Bearer"


def test_a_problem_over_the_limits_gets_413(server):
    too_many_chars = post(server, {"problem": "1" * 9000})
    assert too_many_chars.status_code == 413 and "8192" in too_many_chars.json()["detail"]
    # under the character limit, but one token per digit overflows the 2048-token context
    too_many_tokens = post(server, {"problem": "Compute " + "1" * 2000, "max_tokens": 256})
    assert too_many_tokens.status_code == 413
    assert "context of 2048" in too_many_tokens.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"problem": ""}, "problem"),
        ({"problem": "   "}, "problem"),
        ({}, "problem"),
        ({"problem": 3}, "problem"),
        ({**PROBLEM, "samples_per_agent": 0}, "samples_per_agent"),
        ({**PROBLEM, "samples_per_agent": 17}, "samples_per_agent"),
        ({**PROBLEM, "temperature": -0.1}, "temperature"),
        ({**PROBLEM, "temperature": 2.5}, "temperature"),
        ({**PROBLEM, "max_tokens": 257}, "max_tokens"),
        ({**PROBLEM, "colour": "red"}, "colour"),
    ],
)
def test_a_malformed_request_gets_422_naming_the_field(server, body, field):
    response = post(server, body)
    assert response.status_code == 422
    assert field in {str(part) for error in response.json()["detail"] for part in error["loc"]}


def test_invalid_json_and_a_lone_surrogate_get_422(server):
    response = httpx.post(
        server.url + "/predict",
        content=b"{not json",
        timeout=30,
        headers={**server.headers, "content-type": "application/json"},
    )
    assert response.status_code == 422
    surrogate = httpx.post(
        server.url + "/predict",
        content=b'{"problem": "\\ud800"}',
        timeout=30,
        headers={**server.headers, "content-type": "application/json"},
    )
    assert surrogate.status_code == 422 and "unicode" in surrogate.text


def test_one_failing_agent_leaves_the_others_vote_marked_degraded(server):
    response = post(server, {**PROBLEM, "temperature": 0}, path="/faulty/predict")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["degraded"] is True and body["agents"] == ["a0"]
    assert set(body["failed_agents"]) == {"broken"}
    assert "index" in body["failed_agents"]["broken"].lower()  # the embedding's IndexError
    assert list(body["individual_answers"]) == ["a0"]


def test_no_answer_within_the_timeout_gets_504(server):
    response = post(server, PROBLEM, path="/slow/predict")
    assert response.status_code == 504 and "timeout" in response.json()["detail"]


def test_metrics_count_requests_by_status_and_time_agents(server):
    post(server, PROBLEM)
    post(server, PROBLEM, headers={})
    samples = metric_samples(server)
    assert samples['satseq_predict_requests_total{status="200"}'] >= 1
    assert samples['satseq_predict_requests_total{status="401"}'] >= 1
    assert samples["satseq_predict_latency_seconds_count"] >= 2
    assert samples['satseq_agent_generation_seconds_count{agent="a1"}'] >= 1
    assert samples["satseq_vote_agreement_count"] >= 1
    assert samples['satseq_agent_up{agent="a2"}'] == 1
