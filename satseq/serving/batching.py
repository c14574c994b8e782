"""Dynamic batching in an agent replica: the requests that arrive while the engine works go to
it together, in its next call.

A lone request goes to the engine at once. Under load, each call takes every request that
queued during the previous one (up to `max_batch_size`), so batches grow with the load and
nobody waits for a batch to fill. (Ray Serve's `@serve.batch` instead closes a batch
`batch_wait_timeout_s` after its first request, which delays every lone request by that much,
and under load lines up many small batches behind the running one.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")


class EngineBatcher(Generic[Request, Result]):
    """Runs `answer_batch` (results[i] for requests[i], blocking) in a worker thread, one batch
    at a time, on the requests `submit`ted meanwhile. Used from one event loop."""

    def __init__(
        self, answer_batch: Callable[[list[Request]], list[Result]], max_batch_size: int
    ) -> None:
        self.answer_batch = answer_batch
        self.max_batch_size = max_batch_size
        self._queue: deque[tuple[Request, asyncio.Future]] = deque()
        self._worker: asyncio.Task | None = None

    async def submit(self, request: Request) -> Result:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._answer_queued())
        return await future

    async def _answer_queued(self) -> None:
        while self._queue:
            batch = self._take_batch()
            if batch:
                await self._answer(batch)

    def _take_batch(self) -> list[tuple[Request, asyncio.Future]]:
        batch = []
        while self._queue and len(batch) < self.max_batch_size:
            request, future = self._queue.popleft()
            if not future.cancelled():  # else its caller gave up while it queued
                batch.append((request, future))
        return batch

    async def _answer(self, batch: list[tuple[Request, asyncio.Future]]) -> None:
        try:
            results = await asyncio.to_thread(self.answer_batch, [r for r, _ in batch])
        except Exception as error:
            if len(batch) == 1:
                _settle(batch[0][1], error=error)
            else:  # each request alone, so that an error reaches only the request it is about
                for item in batch:
                    await self._answer([item])
            return
        for (_, future), result in zip(batch, results, strict=True):
            _settle(future, result=result)


def _settle(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    if future.done():  # cancelled by its caller during the engine call
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
