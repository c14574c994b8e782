"""The OpenAI-compatible routes' bodies: what /v1/chat/completions and /v1/completions take, and
the completion, stream chunk, model list and error objects they return, in OpenAI's shapes.

Requests are strict: a field OpenAI has but satseq does not implement (logprobs, tools,
penalties, ...) is refused (400), not ignored, so that a client never takes an answer for one
made as it asked. `openai_request_models` adds the bounds of the deployment's serve settings,
as /predict's request does, so /docs and the OpenAPI schema state the real limits.

No `from __future__ import annotations`: pydantic's `create_model` and FastAPI read these
annotations at runtime.
"""

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
)

from satseq.config.schema import ServeConfig
from satseq.serving.api import AnsweringAgentsFields, TeamVoteFields, bounded_sampling_fields

TEAM_MODEL = "team"
MAX_STOP_STRINGS = 4  # as OpenAI
# The engines add to a request's seed (per sample, per tool turn); this bound keeps the sums
# inside every engine's 64-bit seed.
MAX_SEED = 2**32 - 1

FinishReason = Literal["stop", "length"]
StopString = Annotated[str, Field(min_length=1)]
StopStrings = Annotated[list[StopString], Field(min_length=1, max_length=MAX_STOP_STRINGS)]


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(OpenAIRequest):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIRequest):
    # "developer" is OpenAI's newer name for "system"; tool messages are not supported
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    @property
    def template_role(self) -> str:
        """The role as chat templates know it."""
        return "system" if self.role == "developer" else self.role


class StreamOptions(OpenAIRequest):
    include_usage: bool = Field(False, description="a last chunk with the usage, no choices")


class CompletionFields(OpenAIRequest):
    """What both completion routes take; `openai_request_models` adds the bounded fields."""

    model: str = Field(
        description=f"`{TEAM_MODEL}` (the team's vote) or an agent's name; GET /v1/models "
        "lists them"
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="null: the serve default")
    stop: StopString | StopStrings | None = Field(
        None,
        description=f"up to {MAX_STOP_STRINGS} strings; each text ends before the first of them",
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="the same request and seed give the same text (when the engine does not "
        "batch it with another seeded request of the same settings)",
    )
    stream: bool = Field(False, description="server-sent events of OpenAI's chunks")
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="the end user's id, as OpenAI takes it; unused")

    @field_validator("stream_options")
    @classmethod
    def _only_with_stream(
        cls, options: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed with stream: true")
        return options

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def new_tokens(self) -> int | None:
        """The request's max new tokens (max_tokens comes from `openai_request_models`)."""
        return self.max_tokens

    @property
    def characters(self) -> int:
        """The length of the text the request asks about (serve.max_problem_chars bounds it)."""
        raise NotImplementedError


class ChatCompletionFields(CompletionFields):
    messages: list[ChatMessage] = Field(
        min_length=1,
        description="the conversation; its last message, the user's, is asked as /predict "
        "asks a problem (the team's prompt format around it)",
    )

    # (both fields come from `openai_request_models`, max_tokens first)
    @field_validator("max_completion_tokens", check_fields=False)
    @classmethod
    def _not_with_max_tokens(cls, limit: int | None, info: ValidationInfo) -> int | None:
        if limit is not None and info.data.get("max_tokens") is not None:
            raise ValueError("max_tokens and max_completion_tokens are the same limit: send one")
        return limit

    @property
    def new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def characters(self) -> int:
        return sum(len(message.text) for message in self.messages)


class TextCompletionFields(CompletionFields):
    prompt: str = Field(
        min_length=1, description="text the model continues as it is (no chat template)"
    )

    @property
    def characters(self) -> int:
        return len(self.prompt)


def openai_request_models(
    settings: ServeConfig,
) -> tuple[type[ChatCompletionFields], type[TextCompletionFields]]:
    """The two routes' request models with the deployment's bounds."""
    shared: dict[str, Any] = {
        **bounded_sampling_fields(settings),
        "n": (
            int | None,
            Field(
                None,
                ge=1,
                le=settings.max_samples_per_agent,
                description=f"choices: for `{TEAM_MODEL}`, n votes of serve.samples_per_agent "
                "samples per agent each; for an agent, n samples; null: 1",
            ),
        ),
    }
    chat = create_model(
        "ChatCompletionRequest",
        __base__=ChatCompletionFields,
        **shared,
        max_completion_tokens=(
            shared["max_tokens"][0],
            Field(None, ge=1, le=settings.max_tokens, description="max_tokens' newer name"),
        ),
    )
    text = create_model("CompletionRequest", __base__=TextCompletionFields, **shared)
    return chat, text


class Usage(BaseModel):
    prompt_tokens: int = Field(description="for `team`, every asked agent's prompt")
    completion_tokens: int = Field(description="for `team`, every sample of every agent")
    total_tokens: int


class ChoiceVote(TeamVoteFields):
    response_agent: str = Field(description="the agent whose sample is the choice's text")


class TeamVotes(AnsweringAgentsFields):
    """The `satseq` field of a `team` completion: the vote behind each choice."""

    choices: list[ChoiceVote] = Field(description="choices[i]'s vote")


class CompletionObject(BaseModel):
    id: str
    created: int = Field(description="Unix time, seconds")
    model: str
    satseq: TeamVotes | None = Field(
        None, description=f"`{TEAM_MODEL}`: each choice's vote (in a stream: the first chunk)"
    )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(CompletionObject):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(CompletionObject):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class TextChunkChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None = None
    logprobs: None = None


class TextCompletionChunk(CompletionObject):
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChunkChoice]
    usage: Usage | None = None


# OpenAI streams a text completion as text_completion objects: the whole one is a chunk with
# every choice finished and the usage known.
class TextChoice(TextChunkChoice):
    finish_reason: FinishReason


class TextCompletion(TextCompletionChunk):
    choices: list[TextChoice]
    usage: Usage


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="when this ingress replica started, Unix time")
    owned_by: str = "satseq"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, rate_limit_error or server_error")
    param: str | None = Field(description="the request field at fault")
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail
