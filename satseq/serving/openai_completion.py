"""A completion request answered by the team or by one agent: the OpenAI routes' core, on the
ingress's own steps (`TeamIngress.agent_prompts`, `ask`, `vote`), so that `model: team` is
/predict's vote and every limit and failure is /predict's.

- `team`: each agent samples n × serve.samples_per_agent (K) times in one engine call; choice i
  is the vote over every agent's samples i·K … i·K + K − 1, and its text is the response of the
  vote's winner (the first sample, in agent order, with the winning answer; with no answer at
  all, the first sample). `usage` counts what the team spent: every asked agent's prompt and
  every sample.
- an agent: n samples of that agent alone; `usage` as OpenAI counts it (the prompt once).

A text ends before the first of the request's `stop` strings (the engines stop on the token that
completes one, and keep it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from jinja2 import TemplateError

from satseq.actors.trajectory import SamplingSpec
from satseq.data import DataError, PromptFormat, apply_chat_template, build_messages
from satseq.evaluation.vote import TeamVote
from satseq.serving.agent import AgentAnswers
from satseq.serving.api import Team
from satseq.serving.openai_errors import OpenAIError
from satseq.serving.openai_schema import (
    TEAM_MODEL,
    ChatMessage,
    ChoiceVote,
    CompletionFields,
    TeamVotes,
    Usage,
)

Encode = Callable[[Any], list[int]]
"""A tokenizer → the prompt's token ids for it."""


class CompletingTeam(Team, Protocol):
    """What a completion needs of the ingress (`satseq.serving.ingress.TeamIngress`)."""

    agents: dict[str, Any]
    prompt_format: PromptFormat

    def agent_prompts(
        self, encode: Encode, characters: int, max_tokens: int, agents: list[str]
    ) -> dict[str, list[int]]: ...

    async def ask(
        self, prompts: dict[str, list[int]], n: int, spec: SamplingSpec
    ) -> tuple[dict[str, AgentAnswers], dict[str, str]]: ...

    async def vote(self, answered: dict[str, AgentAnswers]) -> TeamVote: ...


@dataclass(frozen=True)
class Choice:
    text: str
    finish_reason: str


@dataclass(frozen=True)
class Completed:
    """What a request got: its choices, the tokens spent, and for `team` each choice's vote."""

    choices: list[Choice]
    usage: Usage
    satseq: TeamVotes | None


def model_names(team: CompletingTeam) -> list[str]:
    return [TEAM_MODEL, *team.agents]


def check_model(team: CompletingTeam, model: str) -> None:
    """404 unless `model` is served: the first check of a request, as OpenAI's."""
    if model not in model_names(team):
        raise OpenAIError(
            404, f"there is no model {model!r}: this team serves {model_names(team)}", "model"
        )


def chat_encoder(messages: list[ChatMessage], prompt_format: PromptFormat) -> Encode:
    """The conversation as the agents were trained to read it: its last message, the user's, is
    put as /predict puts a problem (`build_messages`: the format's instructions around it), after
    the earlier turns. The format's system prompt opens it unless the client sent its own. A
    single user message is therefore exactly /predict's prompt."""
    *history, last = messages
    if last.role != "user":
        raise OpenAIError(
            422,
            f"the last message is the {last.role}'s; it must be the user's: the agents answer it",
            param=f"messages[{len(messages) - 1}].role",
        )
    turns = [{"role": message.template_role, "content": message.text} for message in history]
    if any(turn["role"] == "system" for turn in turns):
        prompt_format = replace(prompt_format, system_prompt=None)
    asked = build_messages(last.text, prompt_format)
    system = [turn for turn in asked if turn["role"] == "system"]
    conversation = system + turns + [turn for turn in asked if turn["role"] != "system"]

    def encode(tokenizer: Any) -> list[int]:
        try:
            text = apply_chat_template(tokenizer, conversation, prompt_format)
        except (TemplateError, DataError) as error:
            raise OpenAIError(
                422, f"the agents' chat template refuses these messages: {error}", "messages"
            ) from None
        return tokenizer.encode(text, add_special_tokens=False)

    return encode


def text_encoder(prompt: str) -> Encode:
    """The prompt as it is, with the tokenizer's special tokens (as vLLM's completions)."""
    return lambda tokenizer: tokenizer.encode(prompt)


async def complete(team: CompletingTeam, request: CompletionFields, encode: Encode) -> Completed:
    """`request` (chat or text: `encode` makes its prompt) answered by its model, which
    `check_model` has found served."""
    settings = team.settings
    n = request.n or 1
    max_tokens = request.new_tokens or settings.max_tokens
    spec = SamplingSpec(
        temperature=settings.temperature if request.temperature is None else request.temperature,
        top_p=settings.top_p if request.top_p is None else request.top_p,
        max_new_tokens=max_tokens,
        stop=request.stop_strings,
        seed=request.seed,
    )
    agents = list(team.agents) if request.model == TEAM_MODEL else [request.model]
    prompts = team.agent_prompts(encode, request.characters, max_tokens, agents)
    if request.model == TEAM_MODEL:
        return await complete_as_team(team, prompts, n, spec)
    answered, _ = await team.ask(prompts, n, spec)
    (answers,) = answered.values()
    return Completed(
        [choice_of(trajectory, spec.stop) for trajectory in answers.trajectories],
        usage(len(prompts[request.model]), sum(answers.completion_tokens)),
        None,
    )


async def complete_as_team(
    team: CompletingTeam, prompts: dict[str, list[int]], n: int, spec: SamplingSpec
) -> Completed:
    per_vote = team.settings.samples_per_agent
    if n * per_vote > team.settings.max_samples_per_agent:
        raise OpenAIError(
            400,
            f"n={n} team votes of serve.samples_per_agent={per_vote} samples each ask every "
            f"agent for {n * per_vote} samples; serve.max_samples_per_agent is "
            f"{team.settings.max_samples_per_agent}",
            param="n",
        )
    answered, failed = await team.ask(prompts, n * per_vote, spec)
    choices, votes = [], []
    for i in range(n):
        group = {name: a.samples(i * per_vote, per_vote) for name, a in answered.items()}
        vote = await team.vote(group)
        agent, trajectory = winning_sample(group, vote)
        choices.append(choice_of(trajectory, spec.stop))
        votes.append(
            ChoiceVote(
                predicted_answer=vote.answer,
                individual_answers={name: a.answers for name, a in group.items()},
                votes=vote.votes,
                agreement=vote.agreement,
                response_agent=agent,
            )
        )
    return Completed(
        choices,
        usage(
            sum(len(prompts[name]) for name in answered),
            sum(sum(a.completion_tokens) for a in answered.values()),
        ),
        TeamVotes(
            choices=votes, agents=list(answered), degraded=bool(failed), failed_agents=failed
        ),
    )


def winning_sample(answered: dict[str, AgentAnswers], vote: TeamVote) -> tuple[str, dict[str, Any]]:
    """(agent, trajectory) of the first sample whose answer is the vote's (the winning cluster's
    representative is its first sample's answer), or of the first sample when none answered."""
    for name, answers in answered.items():
        for answer, trajectory in zip(answers.answers, answers.trajectories, strict=True):
            if vote.answer is None or answer == vote.answer:
                return name, trajectory
    raise ValueError(f"no sample has the voted answer {vote.answer!r}")


def choice_of(trajectory: dict[str, Any], stop: tuple[str, ...]) -> Choice:
    text = trajectory["response"]
    end = min((text.find(s) for s in stop if s in text), default=len(text))
    return Choice(text[:end], trajectory["finish_reason"])


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )
