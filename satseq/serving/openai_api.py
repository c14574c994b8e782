"""The team behind OpenAI's API, on the same app as /predict: GET /v1/models,
POST /v1/chat/completions and POST /v1/completions, so that the `openai` client, LangChain or an
eval harness pointed at `<base URL>/v1` talks to the team (model `team`) or to one agent.

A stream (`stream: true`) is server-sent events of OpenAI's chunks: the engines write whole
responses, so each choice's text comes in one chunk once its engine call is done, then a chunk
with its finish reason, the usage (with `stream_options.include_usage`) and `data: [DONE]`.

No `from __future__ import annotations`: FastAPI reads the routes' annotations, and the request
models are built per deployment (`openai_request_models`).
"""

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import chain
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from satseq.serving.api import api_key_check
from satseq.serving.openai_completion import (
    Completed,
    CompletingTeam,
    Encode,
    chat_encoder,
    check_model,
    complete,
    model_names,
    text_encoder,
)
from satseq.serving.openai_errors import OpenAIRoute
from satseq.serving.openai_schema import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    CompletionFields,
    ErrorResponse,
    Model,
    ModelList,
    TextChoice,
    TextChunkChoice,
    TextCompletion,
    TextCompletionChunk,
    openai_request_models,
)

PREFIX = "/v1"
STREAM_DONE = "data: [DONE]\n\n"
ERRORS = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "a field is malformed or out of bounds; `param` names it",
        401: "the API key is set and the request lacks `Authorization: Bearer KEY`",
        404: "no such model; GET /v1/models lists them",
        413: "the text is too long (characters, or tokens for an agent's context)",
        422: "the agents cannot take the conversation: it does not end with the user's "
        "message, or their chat template refuses it",
        429: "every asked agent is at capacity (its max_queued_requests): retry after "
        "Retry-After seconds",
        503: "every asked agent failed",
        504: "no asked agent answered within serve.timeout_s",
    }.items()
}
STREAM = {"text/event-stream": {"schema": {"type": "string"}}}


def openai_router(team: CompletingTeam) -> APIRouter:
    ChatRequest, CompletionRequest = openai_request_models(team.settings)
    created = int(time.time())
    router = APIRouter(
        prefix=PREFIX,
        tags=["OpenAI-compatible"],
        route_class=OpenAIRoute,
        dependencies=[Depends(api_key_check(team))],
    )

    @router.get("/models", response_model=ModelList, responses=ERRORS)
    async def models() -> ModelList:
        """The team (`team`, the vote) and each agent by its name."""
        return ModelList(data=[Model(id=name, created=created) for name in model_names(team)])

    async def answer(
        body: CompletionFields,
        encoder: Callable[[], Encode],
        as_response: Callable[[Completed, str], Any],
        as_chunks: Callable[[Any, bool], Iterable[BaseModel]],
    ) -> Any:
        """The response to `body`, whole or as a stream of chunks; `encoder()` makes the
        prompt's encoder once the model is known to be served."""
        check_model(team, body.model)
        response = as_response(await complete(team, body, encoder()), body.model)
        if body.stream:
            return event_stream(as_chunks(response, body.include_usage))
        return response

    @router.post(
        "/chat/completions",
        response_model=ChatCompletion,
        responses={**ERRORS, 200: {"content": STREAM}},
    )
    async def chat_completions(body: ChatRequest):
        """The conversation's next message, from the team's vote or one agent."""
        encoder = partial(chat_encoder, body.messages, team.prompt_format)
        return await answer(body, encoder, chat_completion, chat_chunks)

    @router.post(
        "/completions",
        response_model=TextCompletion,
        responses={**ERRORS, 200: {"content": STREAM}},
    )
    async def completions(body: CompletionRequest):
        """The prompt's continuation, from the team's vote or one agent."""
        return await answer(body, partial(text_encoder, body.prompt), text_completion, text_chunks)

    return router


def chat_completion(completed: Completed, model: str) -> ChatCompletion:
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=[
            ChatChoice(
                index=i,
                message=AssistantMessage(content=choice.text),
                finish_reason=choice.finish_reason,
            )
            for i, choice in enumerate(completed.choices)
        ],
        usage=completed.usage,
        satseq=completed.satseq,
    )


def text_completion(completed: Completed, model: str) -> TextCompletion:
    return TextCompletion(
        id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=[
            TextChoice(index=i, text=choice.text, finish_reason=choice.finish_reason)
            for i, choice in enumerate(completed.choices)
        ],
        usage=completed.usage,
        satseq=completed.satseq,
    )


def chat_chunks(response: ChatCompletion, include_usage: bool) -> Iterator[ChatCompletionChunk]:
    """`response` as OpenAI streams it: each choice's role and text, then its finish reason."""
    same = {"id": response.id, "created": response.created, "model": response.model}
    for choice in response.choices:
        delta = ChatDelta(role="assistant", content=choice.message.content)
        yield ChatCompletionChunk(
            **same,
            choices=[ChatChunkChoice(index=choice.index, delta=delta)],
            satseq=response.satseq if choice.index == 0 else None,
        )
    for choice in response.choices:
        finish = ChatChunkChoice(
            index=choice.index, delta=ChatDelta(), finish_reason=choice.finish_reason
        )
        yield ChatCompletionChunk(**same, choices=[finish])
    if include_usage:
        yield ChatCompletionChunk(**same, choices=[], usage=response.usage)


def text_chunks(response: TextCompletion, include_usage: bool) -> Iterator[TextCompletionChunk]:
    """`response` as OpenAI streams it: each choice's text, then its finish reason."""
    same = {"id": response.id, "created": response.created, "model": response.model}
    for choice in response.choices:
        yield TextCompletionChunk(
            **same,
            choices=[TextChunkChoice(index=choice.index, text=choice.text)],
            satseq=response.satseq if choice.index == 0 else None,
        )
    for choice in response.choices:
        finish = TextChunkChoice(index=choice.index, text="", finish_reason=choice.finish_reason)
        yield TextCompletionChunk(**same, choices=[finish])
    if include_usage:
        yield TextCompletionChunk(**same, choices=[], usage=response.usage)


def event_stream(chunks: Iterable[BaseModel]) -> StreamingResponse:
    events = (f"data: {chunk.model_dump_json()}\n\n" for chunk in chunks)
    return StreamingResponse(chain(events, [STREAM_DONE]), media_type="text/event-stream")
