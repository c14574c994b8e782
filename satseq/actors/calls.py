"""How the layers above call an actor: as a Ray actor, or as a plain object in this process.

`start(handle, method, *args)` begins `handle.method(*args)` and returns a pending result, which
may be passed on as an argument of another call (with Ray, an object ref: the value then moves
between actors without passing through the caller); `wait(pending)` turns pending results into
values. The same code then drives `LearnerActor`s and `RolloutActor`s on a cluster, or plain
`Learner` and `RolloutWorker` objects in one process (fast tests, benchmarks).

`method` is the method itself, taken from its class (`Learner.update`), not its name as a
string: a reader and a tool go from the call to its definition. It is called by its name on the
handle, so a Ray actor handle or anything that answers the same names (`LearnerGroup`) serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol


class ActorCalls(Protocol):
    def start(self, handle: Any, method: Callable, *args: Any) -> Any: ...

    def wait(self, pending: list[Any]) -> list[Any]: ...

    def stream(self, handle: Any, method: Callable, *args: Any) -> Iterator[Any]:
        """`handle.method(*args)`, a generator, as pending results, each as it is yielded."""
        ...


class RayCalls:
    """Calls to Ray actors: `actor.method.remote(*args)`, then `ray.get`; calls started
    together run in parallel."""

    def start(self, handle: Any, method: Callable, *args: Any) -> Any:
        return getattr(handle, method.__name__).remote(*args)

    def wait(self, pending: list[Any]) -> list[Any]:
        import ray

        return ray.get(pending)

    def stream(self, handle: Any, method: Callable, *args: Any) -> Iterator[Any]:
        # at most two yielded values wait in the object store for the caller to take them
        options = {"num_returns": "streaming", "_generator_backpressure_num_objects": 2}
        return iter(getattr(handle, method.__name__).options(**options).remote(*args))


class InProcessCalls:
    """Calls to plain objects in this process: each call runs when it is started."""

    def start(self, handle: Any, method: Callable, *args: Any) -> Any:
        return getattr(handle, method.__name__)(*args)

    def wait(self, pending: list[Any]) -> list[Any]:
        return list(pending)

    def stream(self, handle: Any, method: Callable, *args: Any) -> Iterator[Any]:
        return iter(getattr(handle, method.__name__)(*args))
