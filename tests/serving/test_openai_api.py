"""The team behind OpenAI's API: the real `openai` client pointed at the served app's /v1.

Model `team` is /predict's vote (the same prompt, the same answers, the same winner), with the
vote in a `satseq` field; an agent's name is that agent alone, streamed on request. Every
refusal comes in OpenAI's error shape, with the status the client maps to its exception.
"""

import asyncio
import shutil

import httpx
import openai
import pytest
from ray import serve

from satseq.serving.app import AGENT_PREFIX, INGRESS, serve_settings, team_app
from tests.serving.conftest import API_KEY, LIGHT, team_config
from tests.serving.replicas import TEAM

pytestmark = pytest.mark.slow
PROBLEM = "Compute 3 + 4."
ASK = [{"role": "user", "content": PROBLEM}]
SHEDDING_APP = "shedding"


def client(base_url: str, api_key: str = API_KEY, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, **options)


@pytest.fixture(scope="module")
def team(server) -> openai.OpenAI:
    return client(server.url, timeout=300)


def test_models_are_the_team_and_each_agent(team):
    models = team.models.list().data
    assert [model.id for model in models] == ["team", *TEAM]
    assert {model.owned_by for model in models} == {"satseq"}


def test_team_answers_with_the_predict_vote(server, team):
    completion = team.chat.completions.create(model="team", messages=ASK, temperature=0)
    predicted = httpx.post(
        server.url + "/predict",
        json={"problem": PROBLEM, "temperature": 0, "return_trajectories": True},
        headers=server.headers,
        timeout=300,
    ).json()
    (vote,) = completion.satseq["choices"]
    assert vote["predicted_answer"] == predicted["predicted_answer"]
    assert vote["individual_answers"] == predicted["individual_answers"]
    assert vote["votes"] == predicted["votes"]
    # the text is the response of a sample with the winning answer
    (winner,) = predicted["trajectories"][vote["response_agent"]]
    assert completion.choices[0].message.content == winner["response"]
    assert completion.choices[0].finish_reason == winner["finish_reason"]
    assert winner["answer"] == vote["predicted_answer"] or vote["predicted_answer"] is None
    assert completion.satseq["agents"] == list(TEAM) and not completion.satseq["degraded"]
    # usage counts every agent's prompt and sample: three times one agent's
    alone = team.chat.completions.create(model="a0", messages=ASK, temperature=0)
    assert completion.usage.prompt_tokens == 3 * alone.usage.prompt_tokens
    assert completion.usage.completion_tokens == 3 * alone.usage.completion_tokens
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


def test_team_n_choices_are_n_votes(team):
    completion = team.chat.completions.create(
        model="team", messages=ASK, temperature=1.0, n=3, seed=7, max_tokens=32
    )
    votes = completion.satseq["choices"]
    assert [choice.index for choice in completion.choices] == [0, 1, 2] and len(votes) == 3
    for vote in votes:  # serve.samples_per_agent (1) sample of each agent per vote
        assert {name: len(answers) for name, answers in vote["individual_answers"].items()} == {
            name: 1 for name in TEAM
        }


def test_an_agent_alone_samples_n_reproducibly(team):
    ask = dict(model="a1", messages=ASK, temperature=1.0, n=2, seed=11, max_tokens=24)
    first = team.chat.completions.create(**ask)
    again = team.chat.completions.create(**ask)
    texts = [choice.message.content for choice in first.choices]
    assert len(texts) == 2 and texts == [choice.message.content for choice in again.choices]
    assert first.model == "a1" and getattr(first, "satseq", None) is None
    assert 1 <= first.usage.completion_tokens <= 2 * 24


@pytest.mark.parametrize("model", ["a2", "team"])
def test_a_stream_is_the_completion_in_chunks(team, model):
    ask = dict(model=model, messages=ASK, temperature=1.0, seed=5, max_tokens=24)
    whole = team.chat.completions.create(**ask)
    chunks = list(
        team.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    )
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    # a team's first chunk carries the vote
    assert getattr(chunks[0], "satseq", None) == getattr(whole, "satseq", None)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and finishes.count(None) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_a_text_completion_ends_before_its_stop_string(team):
    ask = dict(model="a0", prompt="Compute 12 + 7.", temperature=1.0, seed=3, max_tokens=24)
    text = team.completions.create(**ask).choices[0].text
    assert len(text) >= 4, text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopped = team.completions.create(**ask, stop=[stop, "never written"]).choices[0]
    assert stopped.text == text[: text.index(stop)] and stopped.finish_reason == "stop"
    streamed = list(team.completions.create(**ask, stop=stop, stream=True))
    assert "".join(chunk.choices[0].text for chunk in streamed) == stopped.text


def error_of(call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as raised:
        call()
    return raised.value


def test_a_request_without_the_api_key_gets_401(server):
    error = error_of(lambda: client(server.url, api_key="nope").models.list())
    assert isinstance(error, openai.AuthenticationError) and error.code == "invalid_api_key"
    assert "Authorization: Bearer" in error.message


def test_an_unknown_model_gets_404(team):
    error = error_of(lambda: team.chat.completions.create(model="a9", messages=ASK))
    assert isinstance(error, openai.NotFoundError)
    assert (error.code, error.param) == ("model_not_found", "model")
    assert "'team', 'a0', 'a1', 'a2'" in error.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"max_tokens": 257}, "max_tokens"),
        ({"n": 17}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"top_p": 0}, "top_p"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "7"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"logprobs": True}, "logprobs"),  # not implemented: refused, not ignored
        ({"max_tokens": 8, "max_completion_tokens": 8}, "max_completion_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_a_bad_field_gets_400_naming_it(team, fields, param):
    body = {"model": "team", "messages": ASK, **fields}
    error = error_of(lambda: team.post("/chat/completions", body=body, cast_to=object))
    assert isinstance(error, openai.BadRequestError)
    assert error.param == param and error.body["type"] == "invalid_request_error"


def test_a_body_that_is_not_json_gets_400_in_openais_shape(server):
    response = httpx.post(
        server.url + "/v1/completions",
        content=b'{"model": "team", "prompt": "\\ud800',
        headers={**server.headers, "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "json_invalid" and set(error) == {"message", "type", "param", "code"}


def test_too_long_gets_413(team):
    error = error_of(lambda: team.completions.create(model="team", prompt="1" * 9000))
    assert error.status_code == 413 and "8192" in error.message
    error = error_of(lambda: team.completions.create(model="a0", prompt="1" * 2000, max_tokens=256))
    assert error.status_code == 413 and error.code == "context_length_exceeded"


def test_a_conversation_not_ending_with_the_user_gets_422(team):
    messages = [*ASK, {"role": "assistant", "content": "7"}]
    error = error_of(lambda: team.chat.completions.create(model="team", messages=messages))
    assert isinstance(error, openai.UnprocessableEntityError)
    assert error.param == "messages[1].role"


def test_no_answer_in_time_gets_504_in_openais_shape(server):
    slow = client(server.url + "/slow", timeout=60)
    error = error_of(lambda: slow.chat.completions.create(model="team", messages=ASK))
    assert error.status_code == 504 and error.body["type"] == "server_error"


@pytest.fixture(scope="module")
def shedding_server(server, tmp_path_factory):
    """One agent, `shed`, that takes one request at a time and queues one more (Ray Serve's
    max_queued_requests): it sheds the rest."""
    team_dir = tmp_path_factory.mktemp("shedding-team")
    shutil.copytree(f"{server.team_dir}/a0", team_dir / "shed")
    config = team_config()
    settings = serve_settings(config, {"checkpoint_dir": str(team_dir)})
    shed = {"max_ongoing_requests": 1, "max_queued_requests": 1, **LIGHT}
    options = {INGRESS: LIGHT, f"{AGENT_PREFIX}shed": shed}
    route = f"/{SHEDDING_APP}"
    serve.run(team_app(config, settings, options), name=SHEDDING_APP, route_prefix=route)
    try:
        yield server.url + route
    finally:
        serve.delete(SHEDDING_APP)


def test_an_agent_shedding_load_gets_429_with_retry_after(shedding_server):
    shedding = openai.AsyncOpenAI(
        base_url=shedding_server + "/v1", api_key=API_KEY, max_retries=0, timeout=300
    )

    async def burst():
        ask = dict(model="shed", prompt=PROBLEM, temperature=1.0, max_tokens=64)
        calls = [shedding.completions.create(**ask, seed=seed) for seed in range(8)]
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = asyncio.run(burst())
    shed = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    answered = [o for o in outcomes if not isinstance(o, Exception)]
    assert shed and answered and len(shed) + len(answered) == len(outcomes), outcomes
    assert shed[0].code == "rate_limit_exceeded" and shed[0].response.headers["retry-after"]


def test_predict_gets_429_too_when_every_agent_sheds(shedding_server):
    async def burst():
        async with httpx.AsyncClient(
            base_url=shedding_server, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=300
        ) as http:
            body = {"problem": PROBLEM, "temperature": 1.0, "max_tokens": 64}
            return await asyncio.gather(*(http.post("/predict", json=body) for _ in range(8)))

    replies = asyncio.run(burst())
    statuses = {reply.status_code for reply in replies}
    assert statuses == {200, 429}, [reply.text for reply in replies]
    shed = next(reply for reply in replies if reply.status_code == 429)
    assert "capacity" in shed.json()["detail"] and shed.headers["retry-after"] == "1"
