"""WorkerPool: a few threads for heavy per-request work, a bounded line in front of them, a time limit.

The event loop must answer every client within milliseconds, so whatever one request may make long
(parsing a large body, compiling a grammar) runs here instead. A pool never queues without bound: once
its workers are busy and ``max_waiting`` jobs wait, ``run`` raises WorkerPoolFull at once (the server
answers 503 with Retry-After). A job that runs longer than ``timeout_s`` (counted from when a worker
starts it, not while it waits in line) raises WorkerTimeout to its caller; its thread cannot be
interrupted, so its slot stays taken until the job really ends, and the line stays honest about the
work in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class WorkerPoolFull(RuntimeError):
    """Every worker is busy and the line is full: retry later (HTTP 503 + Retry-After)."""

    retry_after_s = 1


class WorkerTimeout(TimeoutError):
    """A job ran past the pool's time limit; its result is dropped."""


class WorkerPool:
    def __init__(self, name: str, workers: int, max_waiting: int, timeout_s: float | None = None) -> None:
        if workers < 1 or max_waiting < 0:
            raise ValueError(
                f"{name}: workers must be >= 1 and max_waiting >= 0, got {workers}, {max_waiting}"
            )
        self.name, self.workers, self.max_waiting, self.timeout_s = name, workers, max_waiting, timeout_s
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=name.replace(" ", "-"))
        self._lock = threading.Lock()
        self._in_flight = 0  # running or waiting; a timed-out job counts until its thread is done

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def submit(self, function: Callable[..., T], *args: Any) -> Future[T]:
        """Start the job in the pool, or raise WorkerPoolFull without queueing it."""
        with self._lock:
            if self._in_flight >= self.workers + self.max_waiting:
                raise WorkerPoolFull(
                    f"the server is busy: {self.workers} {self.name} workers are busy and {self.max_waiting} "
                    "jobs wait for them. Retry later."
                )
            self._in_flight += 1
        try:
            future = self._executor.submit(function, *args)
        except BaseException:
            self._release(None)
            raise
        future.add_done_callback(self._release)
        return future

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """The job's result, awaited without blocking the event loop; WorkerPoolFull when the line is
        full, WorkerTimeout once it has run for timeout_s, else whatever the job raised."""
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()

        def job() -> T:
            with contextlib.suppress(RuntimeError):  # the caller's loop has closed: run it all the same
                loop.call_soon_threadsafe(_set_once, started)
            return function(*args)

        future = asyncio.wrap_future(self.submit(job))
        try:
            waits: set[asyncio.Future[Any]] = {started, future}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            raise WorkerTimeout(f"{self.name}: the job ran longer than {self.timeout_s:g} s") from None
        finally:
            future.cancel()  # a caller that left takes its job out of the line (a running one ends alone)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _release(self, _future: Future | None) -> None:
        # a job cancelled in the line never runs; one that ran releases when it ends
        with self._lock:
            self._in_flight -= 1


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
