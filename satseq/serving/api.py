"""The HTTP surface of the team: request/response schemas and the FastAPI app (design §7).

No `from __future__ import annotations` here: FastAPI reads the route signatures' annotations,
and the request model is built per deployment from the configured bounds, so /docs and the
OpenAPI schema state the real limits.
"""

import hmac
import json
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from satseq.config.schema import ServeConfig
from satseq.serving.metrics import ServeMetrics

MAX_TEMPERATURE = 2.0
PREDICT_PATH = "/predict"


class PredictFields(BaseModel):
    """What every /predict body shares; `predict_request_model` adds the configured bounds."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("problem", check_fields=False)
    @classmethod
    def _not_blank(cls, problem: str) -> str:
        # (pydantic itself refuses text that is not valid Unicode, such as a lone surrogate)
        if not problem.strip():
            raise ValueError("problem is blank")
        return problem


class ToolTurn(BaseModel):
    text: str = Field(description="what the model wrote this turn")
    code: list[str] = Field(description="the code blocks it wrote (<code>…</code>)")
    interpreter: str | None = Field(
        description="the sandbox's output spliced in after the turn, as the model read it "
        "(<interpreter>…</interpreter>); null: nothing ran after it"
    )


class SampleTrajectory(BaseModel):
    response: str = Field(description="the whole response: model text and tool output")
    answer: str | None = Field(description="the extracted answer")
    finish_reason: str = Field(description="'stop', or 'length' when max_tokens cut it")
    tool_statuses: list[str] = Field(description="the sandbox's status of each code run")
    turns: list[ToolTurn] = Field(description="one per model turn (one without tools)")


class TeamVoteFields(BaseModel):
    """One vote of the team: /predict's, and each of an OpenAI team completion's choices."""

    predicted_answer: str | None = Field(description="the team's vote; null: no agent answered")
    individual_answers: dict[str, list[str | None]] = Field(
        description="agent → its samples' extracted answers"
    )
    votes: dict[str, int] = Field(description="answer (a cluster's first) → votes")
    agreement: float = Field(description="the winner's share of the votes cast")


class AnsweringAgentsFields(BaseModel):
    """Which agents took part in a team's answer."""

    agents: list[str] = Field(description="the agents that answered")
    degraded: bool = Field(description="some agent failed or timed out; the others voted")
    failed_agents: dict[str, str] = Field(description="agent → why it has no answer")


# (bases in this order keep the vote's fields first in the JSON)
class PredictResponse(AnsweringAgentsFields, TeamVoteFields):
    latency_ms: float
    trajectories: dict[str, list[SampleTrajectory]] | None = Field(
        None, description="with return_trajectories: agent → each sample's turns"
    )


class Health(BaseModel):
    status: str = Field(description="'ok' when every agent deployment answers")
    agents: dict[str, bool]


class Team(Protocol):
    """What the app needs from the ingress (see `satseq.serving.ingress.TeamIngress`)."""

    settings: ServeConfig
    metrics: ServeMetrics
    api_key: str | None

    async def predict(
        self,
        problem: str,
        samples_per_agent: int,
        temperature: float,
        max_tokens: int,
        return_trajectories: bool = False,
    ) -> PredictResponse: ...

    async def health(self) -> Health: ...


def bounded_sampling_fields(settings: ServeConfig) -> dict[str, Any]:
    """`temperature` and `max_tokens` with the deployment's bounds, as `create_model` takes
    fields: /predict and the OpenAI routes accept the same values (null: the serve default)."""
    return {
        "temperature": (
            float | None,
            Field(None, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False, description="0: greedy"),
        ),
        "max_tokens": (
            int | None,
            Field(
                None,
                ge=1,
                le=settings.max_tokens,
                description="new tokens per sample (with tools: model and tool output together)",
            ),
        ),
    }


def predict_request_model(settings: ServeConfig) -> type[PredictFields]:
    return create_model(
        "PredictRequest",
        __base__=PredictFields,
        problem=(
            str,
            Field(
                min_length=1,
                description=f"the math problem; over {settings.max_problem_chars} characters "
                "gets 413",
            ),
        ),
        samples_per_agent=(
            int | None,
            Field(None, ge=1, le=settings.max_samples_per_agent, description="K per agent"),
        ),
        **bounded_sampling_fields(settings),
        return_trajectories=(
            bool,
            Field(False, description="also return each sample's text and tool turns"),
        ),
    )


ERRORS = {
    401: {"description": "the API key is set and the request lacks `Authorization: Bearer KEY`"},
    413: {"description": "the problem is too long (characters, or tokens for an agent's context)"},
    422: {"description": "the body is malformed or out of bounds; the detail says which field"},
    429: {
        "description": "every agent shed the request (its deployment's max_queued_requests is "
        "full): retry after Retry-After seconds"
    },
    503: {"description": "every agent failed"},
    504: {"description": "no agent answered within the request timeout"},
}


class PredictObserver:
    """ASGI middleware counting /predict responses by status (whatever answered: the route,
    the API key check, validation) and timing them to their first byte. Plain ASGI: Starlette's
    `@app.middleware("http")` costs a task and a stream per request."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PREDICT_PATH:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(status=str(message["status"])).inc()
                self.metrics.latency.observe(time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, observed_send)


def api_key_check(team: Team) -> Callable[..., Awaitable[None]]:
    """The dependency of /predict and the OpenAI routes: when the team's API key is set, 401
    unless the request sends `Authorization: Bearer <key>`."""
    bearer = HTTPBearer(auto_error=False, description="needed when the API key is set")

    async def check_api_key(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        if team.api_key is None:
            return
        if credentials is None or not hmac.compare_digest(
            credentials.credentials.encode(), team.api_key.encode()
        ):
            raise HTTPException(
                401,
                "missing or wrong API key: send the header `Authorization: Bearer <key>`",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check_api_key


def make_api(team: Team) -> FastAPI:
    settings = team.settings
    PredictRequest = predict_request_model(settings)
    check_api_key = api_key_check(team)
    app = FastAPI(
        title="satseq team",
        description="A trained team of LLM agents answering math problems by majority vote.",
    )

    @app.exception_handler(RequestValidationError)
    async def unprocessable(request: Request, error: RequestValidationError) -> Response:
        # ASCII-escaped, unlike FastAPI's own handler: the errors echo the input, and an input
        # holding a lone surrogate cannot be encoded as UTF-8.
        body = json.dumps({"detail": jsonable_encoder(error.errors())}, ensure_ascii=True)
        return Response(body, status_code=422, media_type="application/json")

    app.add_middleware(PredictObserver, metrics=team.metrics)

    @app.post(
        PREDICT_PATH,
        response_model=PredictResponse,
        responses=ERRORS,
        dependencies=[Depends(check_api_key)],
    )
    async def predict(body: PredictRequest) -> PredictResponse:
        """The team's answer to `problem`: every agent samples, the answers are voted on."""
        return await team.predict(
            body.problem,
            body.samples_per_agent or settings.samples_per_agent,
            settings.temperature if body.temperature is None else body.temperature,
            body.max_tokens or settings.max_tokens,
            body.return_trajectories,
        )

    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    async def health() -> JSONResponse:
        """200 when every agent deployment is ready, else 503 with which are not."""
        state = await team.health()
        return JSONResponse(state.model_dump(), status_code=200 if state.status == "ok" else 503)

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics: requests by status, latency, agent generation time, agreement."""
        return Response(team.metrics.export(), media_type=CONTENT_TYPE_LATEST)

    return app
