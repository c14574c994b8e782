"""An agent's learner as the layers above hold it, whatever runs it: one `LearnerHandle` type.

On Ray a learner is called exactly as one Ray actor is (`handle.update.remote(...)`,
`handle.weight_buckets.options(num_returns="streaming").remote(...)`), and runs in
- a `LearnerActor` of its own (`ActorLearner`),
- W sharded ranks (`group.LearnerGroup`), or
- a process that holds the learners of several agents (`host.HostedLearner`);
in this process it is a plain `Learner` (`LocalLearner`, whose methods `InProcessCalls` calls
directly). Each says which actors it stands for (`actors`: what fault handling watches and
asks for incarnations) and how it stops (`stop`: a swap replaces it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class LearnerHandle(ABC):
    """An agent's learner: the actors it runs in, and how it stops."""

    @property
    @abstractmethod
    def actors(self) -> list[Any]:
        """The actors this learner runs in (Ray actors, or the plain learner itself)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop this learner (its replacement is started); what it shares stays."""


class RemoteLearner(LearnerHandle):
    """A learner on Ray: answers any public method name with a call that `.options(...)` and
    `.remote(...)` take, as a Ray actor handle does."""

    @abstractmethod
    def call(self, method: str, options: dict[str, Any], args: tuple) -> Any:
        """Begin `method(*args)` with Ray's call `options`; a pending result (or a stream)."""

    def stop(self) -> None:
        """Kill the learner's actors for good (Ray restarts none of them)."""
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method, {})


class _Method:
    def __init__(self, handle: RemoteLearner, name: str, options: dict[str, Any]):
        self.handle, self.name, self.options_ = handle, name, options

    def options(self, **options: Any) -> _Method:
        return _Method(self.handle, self.name, options)

    def remote(self, *args: Any) -> Any:
        return self.handle.call(self.name, self.options_, args)


class ActorLearner(RemoteLearner):
    """An agent's learner in a `LearnerActor` of its own."""

    def __init__(self, actor: Any):
        self.actor = actor

    @property
    def actors(self) -> list[Any]:
        return [self.actor]

    def call(self, method: str, options: dict[str, Any], args: tuple) -> Any:
        return getattr(self.actor, method).options(**options).remote(*args)


class LocalLearner(LearnerHandle):
    """A plain `Learner` in this process: its attributes and methods are the learner's."""

    def __init__(self, learner: Any):
        self.learner = learner

    @property
    def actors(self) -> list[Any]:
        return [self.learner]

    def stop(self) -> None:
        """Nothing runs apart from this process: a replaced learner is garbage-collected."""

    def __getattr__(self, name: str) -> Any:
        if name == "learner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.learner, name)
