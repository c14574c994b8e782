"""A learner reached through other actors, called exactly as one Ray actor is:
`handle.update.remote(...)`, `handle.weight_buckets.options(num_returns="streaming").remote(...)`.

Two kinds: a sharded agent's W ranks (`group.LearnerGroup`) and an agent whose learner shares a
process with others (`host.HostedLearner`). Each says which Ray actors it stands for (`actors`:
what fault handling watches and kills) and how a call reaches them (`call`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class LearnerHandle(ABC):
    """Answers any public method name with a call that `.options(...)` and `.remote(...)`
    take, as a Ray actor handle does."""

    @property
    @abstractmethod
    def actors(self) -> list[Any]:
        """The Ray actors this learner runs in."""

    @abstractmethod
    def call(self, method: str, options: dict[str, Any], args: tuple) -> Any:
        """Begin `method(*args)` with Ray's call `options`; a pending result (or a stream)."""

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method, {})


class _Method:
    def __init__(self, handle: LearnerHandle, name: str, options: dict[str, Any]):
        self.handle, self.name, self.options_ = handle, name, options

    def options(self, **options: Any) -> _Method:
        return _Method(self.handle, self.name, options)

    def remote(self, *args: Any) -> Any:
        return self.handle.call(self.name, self.options_, args)


def learner_actors(learner: Any) -> list[Any]:
    """The Ray actors behind a learner handle: its `actors`, or the actor itself."""
    return learner.actors if isinstance(learner, LearnerHandle) else [learner]
