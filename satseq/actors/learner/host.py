"""Several agents' learners in one process (design §12): the LoRA agents of one base, which
update one at a time, so that a team of n adapters pays for one interpreter, one torch and one
mapped base instead of n. `LearnerHost` is the plain class its actor runs; `HostedLearner` is an
agent's handle, called as that agent's own learner actor would be.

Calls to the agents of one host take turns (Ray runs one call of an actor at a time). Each
learner keeps its own torch random stream (the host swaps it in around each of its calls), so a
hosted learner steps, saves and resumes exactly as it would in a process of its own. The LoRA
learners of one base hold one copy of its frozen weights (`AgentPolicy.share_base`): on the CPU
they map one file anyway, on a GPU this is the difference between one copy and n.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import torch

from satseq.actors.incarnation import PROCESS_ID
from satseq.actors.learner.handle import RemoteLearner
from satseq.actors.learner.learner import Learner
from satseq.actors.learner.specs import LearnerSpec
from satseq.actors.residency import return_free_host_memory


class LearnerHost:
    """The learners of `specs`' agents, each called by its agent index."""

    def __init__(self, specs: list[LearnerSpec]):
        self.learners: dict[int, Learner] = {}
        self.rng: dict[int, dict[str, Any]] = {}
        """Each learner's torch random state between its calls."""
        self.shared: dict[int, Any] = {}
        """Each learner's policy whose base is shared (a `reset` makes a new one)."""
        for spec in specs:
            self.add(spec)

    def add(self, spec: LearnerSpec) -> None:
        """A learner for `spec`'s agent (in place of its old one: a swap)."""
        self.learners[spec.agent_index] = Learner(spec)  # seeds the global generator
        self.rng[spec.agent_index] = _rng_state()
        self._share_base(spec.agent_index)

    def call(self, agent: int, method: str, *args: Any) -> Any:
        """Agent `agent`'s `Learner.<method>(*args)`."""
        with self._own_rng(agent):
            result = getattr(self.learners[agent], method)(*args)
        self._share_base(agent)
        return result

    def stream(self, agent: int, method: str, *args: Any) -> Iterator[Any]:
        """Agent `agent`'s generator method, yielded through (a Ray streaming call)."""
        with self._own_rng(agent):
            yield from getattr(self.learners[agent], method)(*args)

    def drop(self, agent: int) -> None:
        """Free agent `agent`'s learner (swapped out; `add` brings its successor)."""
        del self.learners[agent], self.rng[agent], self.shared[agent]
        gc.collect()
        return_free_host_memory()

    def ready(self) -> bool:
        return True

    def incarnation(self) -> str:
        """The process the learners run in (`satseq.actors.incarnation`)."""
        return PROCESS_ID

    def _share_base(self, agent: int) -> None:
        """Agent `agent`'s base weights become another learner's copy of the same base, once
        per policy it has (its first, and each that `reset` builds)."""
        policy = self.learners[agent].policy
        if self.shared.get(agent) is policy:
            return
        self.shared[agent] = policy
        others = (learner.policy for i, learner in self.learners.items() if i != agent)
        if any(policy.share_base(other) for other in others):
            gc.collect()  # its own copy goes now, not at the next collection
            return_free_host_memory()

    @contextlib.contextmanager
    def _own_rng(self, agent: int) -> Iterator[None]:
        _set_rng_state(self.rng[agent])
        try:
            yield
        finally:
            self.rng[agent] = _rng_state()


def _rng_state() -> dict[str, Any]:
    """The process's torch generators: the CPU's and, once CUDA is in use, the GPU's."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


class HostedLearner(RemoteLearner):
    """Agent `agent`'s learner in the `LearnerHost` actor `host`."""

    def __init__(self, host: Any, agent: int):
        self.host = host
        self.agent = agent

    @property
    def actors(self) -> list[Any]:
        return [self.host]

    def call(self, method: str, options: dict[str, Any], args: tuple) -> Any:
        streaming = options.get("num_returns") == "streaming"
        target = self.host.stream if streaming else self.host.call
        return target.options(**options).remote(self.agent, method, *args)

    def stop(self) -> None:
        """Leave the host, which stays for the other agents' learners."""
        import ray

        ray.get(self.host.drop.remote(self.agent))
