"""cronoq.connect_sync: the client for code that is not async (Flask, Django, scripts).

The asynchronous client runs on an event loop in one background thread; each
method hands it a coroutine and blocks until the answer comes back. One
SyncClient may be shared by many threads.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, Sequence, TypeVar

from cronoq.answers import Explanation, TaskInfo
from cronoq.client.client import DEFAULT_CLIENT_ADDRESS, DEFAULT_REQUEST_TIMEOUT, Client

T = TypeVar("T")


class SyncTaskHandle:
    """A submitted task, for blocking code. `id` works with any client."""

    __slots__ = ("id", "duplicate", "_client")

    def __init__(self, task_id: str, client: "SyncClient", duplicate: bool) -> None:
        self.id = task_id
        self.duplicate = duplicate
        self._client = client

    def result(self, timeout: float | None = None) -> Any:
        """Block until the task's value; raises TaskFailed, DeadlineExceeded, Cancelled or TimeoutError."""
        return self._client.result(self.id, timeout=timeout)

    def status(self) -> TaskInfo:
        """A snapshot of the task: state, attempts, timings."""
        return self._client.status(self.id)

    def cancel(self) -> bool:
        """Cancel the task if it has not been dispatched; False if it already runs or has finished."""
        return self._client.cancel(self.id)

    def explain(self) -> Explanation:
        """Why the task is where it is (see `Client.explain`)."""
        return self._client.explain(self.id)

    def __repr__(self) -> str:
        return f"SyncTaskHandle({self.id!r})"


class SyncClient:
    """A blocking connection to a broker; use as a context manager or call `close()`."""

    def __init__(self, address: str | Sequence[str] = DEFAULT_CLIENT_ADDRESS, token: str | bytes | None = None,
                 *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT, curve_public_key: Any = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cronoq-client", daemon=True)
        self._thread.start()
        self._client = Client(address, token, request_timeout=request_timeout, curve_public_key=curve_public_key)
        self._call(self._client._open())

    @property
    def max_payload_bytes(self) -> int | None:
        """The broker's max_payload_bytes as it last said; None until it has (see `Client.max_payload_bytes`)."""
        return self._client.max_payload_bytes

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, payload: Any, **options: Any) -> SyncTaskHandle:
        """Queue a task (same options as the async `submit`); returns once the broker accepted it."""
        handle = self._call(self._client.submit(payload, **options))
        return SyncTaskHandle(handle.id, self, handle.duplicate)

    def call(self, payload: Any, **options: Any) -> Any:
        """Submit a task and block until its value (same options as the async `call`, `timeout` among them)."""
        return self._call(self._client.call(payload, **options))

    def result(self, task_id: str, timeout: float | None = None) -> Any:
        """Block until the task's value, by id."""
        return self._call(self._client.result(task_id, timeout=timeout))

    def status(self, task_id: str) -> TaskInfo:
        return self._call(self._client.status(task_id))

    def cancel(self, task_id: str) -> bool:
        return self._call(self._client.cancel(task_id))

    def explain(self, task_id: str) -> Explanation:
        """Why the task is where it is (see `Client.explain`)."""
        return self._call(self._client.explain(task_id))

    def pause(self, pool: str) -> None:
        self._call(self._client.pause(pool))

    def resume(self, pool: str) -> None:
        self._call(self._client.resume(pool))

    def stats(self) -> dict[str, Any]:
        return self._call(self._client.stats())

    def reload(self) -> dict[str, Any]:
        return self._call(self._client.reload())

    def close(self) -> None:
        """Close the connection and stop the background loop."""
        if self._loop.is_closed():
            return
        self._call(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def connect_sync(address: str | Sequence[str] = DEFAULT_CLIENT_ADDRESS, token: str | bytes | None = None,
                 *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT, curve_public_key: Any = None) -> SyncClient:
    """A blocking client for the broker at `address`: `with cronoq.connect_sync(...) as sched:`. As with
    `cronoq.connect`, `address` may list a primary's and its standbys' client endpoints."""
    return SyncClient(address, token, request_timeout=request_timeout, curve_public_key=curve_public_key)
