"""A team's engines, one per base for its LoRA agents (design §12).

`team_engines` gives each agent an `Engine`: a full model its own, and the LoRA agents on one
base (adapter directories, `satseq.models.adapters`) one engine between them, started with
every adapter (vLLM's multi-LoRA, or a peft model with one adapter per agent), behind a
`LoraAgentEngine` per agent. A team of n LoRA agents is then one model and one KV cache, and a
push after agent i's update replaces agent i's adapter only. With `rollout.lora_engines:
merged` each LoRA agent has an engine of its own instead, its adapter merged into the base
(`satseq.actors.engines.merged_lora`). The rollout workers and the serving deployments hold
their engines through it.
"""

from __future__ import annotations

from typing import Any

import torch

from satseq.actors.engines.base import Engine, EngineKind
from satseq.actors.engines.factory import make_engine
from satseq.actors.engines.merged_lora import MergedLoraEngine
from satseq.actors.trajectory import Generation, SamplingSpec
from satseq.models import is_adapter_dir
from satseq.models.adapters import adapter_base


class SharedBase:
    """An engine on a base model and the LoRA agents it serves. It sleeps and wakes once for
    all of them, and closes with the last one."""

    def __init__(self, engine: Any, base: str, agents: list[str]):
        self.engine = engine
        self.base = base
        self.agents = set(agents)
        self.asleep_as: str | None = None  # what `sleep` ran, while asleep

    def sleep(self) -> str:
        if self.asleep_as is None:
            self.asleep_as = self.engine.sleep()
        return self.asleep_as

    def wake_up(self) -> str:
        if self.asleep_as is None:
            return "noop:awake"
        self.asleep_as = None
        return self.engine.wake_up()

    def add(self, agent: str, adapter_dir: str) -> None:
        self.engine.add_adapter(agent, adapter_dir)
        self.agents.add(agent)

    def release(self, agent: str) -> None:
        """Agent `agent` leaves: its adapter goes, and the engine with the last agent."""
        self.agents.discard(agent)
        if not self.agents:
            self.engine.close()
        else:
            self.engine.remove_adapter(agent)


class LoraAgentEngine:
    """One LoRA agent's `Engine`: its adapter on the engine it shares with the other LoRA
    agents on its base."""

    def __init__(self, shared: SharedBase, agent: str):
        self.shared = shared
        self.agent = agent

    def generate(
        self, prompts: list[list[int]], spec: SamplingSpec, n: int = 1
    ) -> list[list[Generation]]:
        return self.shared.engine.generate(prompts, spec, n, adapters=[self.agent] * len(prompts))

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """The agent's adapter tensors (PEFT-named, as its learner sends them)."""
        self.shared.engine.load_adapter(self.agent, weights)

    def prompt_logprobs(
        self, sequences: list[list[int]], start: list[int], temperature: float = 1.0
    ) -> list[list[float]]:
        adapters = [self.agent] * len(sequences)
        return self.shared.engine.prompt_logprobs(sequences, start, temperature, adapters=adapters)

    def sleep(self) -> str:
        return self.shared.sleep()

    def wake_up(self) -> str:
        return self.shared.wake_up()

    def close(self) -> None:
        self.shared.release(self.agent)


LORA_ENGINES = "lora_engines"
"""The engine option (`rollout.lora_engines`) that gives each LoRA agent an engine of its own
with its adapter merged in (`merged`) instead of one shared engine per base (`shared`, the
default)."""


def team_engines(
    kind: EngineKind,
    agent_paths: dict[str, str],
    seeds: dict[str, int],
    options: dict[str, Any],
) -> dict[str, Engine]:
    """An engine per agent of `agent_paths` (model or adapter directories), in its order: one
    of its own per full model, one per base shared by the LoRA agents on it (seeded by the
    first of them), or with `options["lora_engines"] == "merged"` one of its own per LoRA
    agent too (`MergedLoraEngine`)."""
    options, merged = _lora_engines(options)
    by_base: dict[str, list[str]] = {}
    for name, path in agent_paths.items():
        if is_adapter_dir(path) and not merged:
            by_base.setdefault(str(adapter_base(path)), []).append(name)
    shared: dict[str, SharedBase] = {}
    for base, agents in by_base.items():
        adapters = {name: agent_paths[name] for name in agents}
        engine = make_engine(kind, base, seed=seeds[agents[0]], adapters=adapters, **options)
        shared.update(dict.fromkeys(agents, SharedBase(engine, base, agents)))
    return {
        name: LoraAgentEngine(shared[name], name)
        if name in shared
        else own_engine(kind, path, seeds[name], options)
        for name, path in agent_paths.items()
    }


def own_engine(kind: EngineKind, path: str, seed: int, options: dict[str, Any]) -> Engine:
    """An engine of the agent's own: on its model, or on its base with its adapter merged in."""
    if is_adapter_dir(path):
        return MergedLoraEngine(kind, path, seed, options)
    return make_engine(kind, path, seed=seed, **options)


def _lora_engines(options: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The engines' own options, and whether LoRA agents get merged engines of their own."""
    options = dict(options)
    return options, options.pop(LORA_ENGINES, "shared") == "merged"


def replace_engine(
    engines: dict[str, Engine],
    kind: EngineKind,
    agent: str,
    path: str,
    seed: int,
    options: dict[str, Any],
) -> Engine:
    """A swap: `agent`'s engine closed (a LoRA agent's: its adapter removed from the shared
    engine) and one for the model or adapter at `path` in its place: an adapter joins an engine
    on its base that has room for it, else starts one of its own (with merged LoRA engines, a
    merged one)."""
    engines[agent].close()
    options, merged = _lora_engines(options)
    if not is_adapter_dir(path) or merged:
        return own_engine(kind, path, seed, options)
    base = str(adapter_base(path))
    for other in engines.values():
        if (
            isinstance(other, LoraAgentEngine)
            and other.shared.agents
            and other.shared.base == base
            and other.shared.engine.can_add_adapter(path)
        ):
            other.shared.add(agent, path)
            return LoraAgentEngine(other.shared, agent)
    engine = make_engine(kind, base, seed=seed, adapters={agent: path}, **options)
    return LoraAgentEngine(SharedBase(engine, base, [agent]), agent)
