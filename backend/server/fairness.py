"""Per-client share of the waiting queue: one client cannot fill the queue for everyone.

A request counts as waiting for its client from the moment the server takes it (before tokenizing and
compiling, which have lines of their own) until its first output, its end, or its refusal. A client with
``max_waiting_per_client`` requests waiting gets 503 + Retry-After for the next one; everyone else is
still admitted while the engine's own queue (max_waiting_requests) has room.

Who the client is: the peer address of the connection. Behind trusted reverse proxies (a Hugging Face
Space, nginx) the owner says how many (``forwarded_hops``); the client is then the address those proxies
appended to X-Forwarded-For, counted from the right: entries further left are whatever the client wrote.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping

from backend.engine.exceptions import EngineOverloadedError


class ClientShareExceeded(EngineOverloadedError):
    """This client already has its share of the waiting queue (HTTP 503 + Retry-After)."""


def client_id(peer: str | None, headers: Mapping[str, str], forwarded_hops: int = 0) -> str:
    """The client's address: the peer's, or the ``forwarded_hops``-th X-Forwarded-For entry from the
    right when that many trusted proxies stand in front (the peer's when the header is shorter)."""
    if forwarded_hops > 0:
        entries = [e.strip() for e in headers.get("x-forwarded-for", "").split(",") if e.strip()]
        if len(entries) >= forwarded_hops:
            return entries[-forwarded_hops]
    return peer or "unknown"


class WaitingTicket:
    """One request's place in its client's share; leave() (idempotent) gives it back."""

    __slots__ = ("_left", "_line", "client")

    def __init__(self, line: ClientLine, client: str) -> None:
        self._line, self.client, self._left = line, client, False

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self._line._leave(self.client)

    def hold_until_collected(self, owner: object) -> None:
        """Leave, at the latest, when ``owner`` is garbage collected (a response that never started)."""
        weakref.finalize(owner, self.leave)


class ClientLine:
    def __init__(self, max_waiting_per_client: int) -> None:
        if max_waiting_per_client < 1:
            raise ValueError(f"max_waiting_per_client must be >= 1, got {max_waiting_per_client}")
        self.max_waiting_per_client = max_waiting_per_client
        self._waiting: dict[str, int] = {}
        self._lock = threading.Lock()  # Gradio's handlers and the API may run on different threads

    def waiting(self, client: str) -> int:
        return self._waiting.get(client, 0)

    def enter(self, client: str) -> WaitingTicket:
        """A ticket for one more waiting request of ``client``, or ClientShareExceeded."""
        with self._lock:
            count = self._waiting.get(client, 0)
            if count >= self.max_waiting_per_client:
                raise ClientShareExceeded(
                    f"Too many requests from this client: {count} are waiting to start (each client may "
                    f"have at most {self.max_waiting_per_client} waiting, so that one client cannot fill "
                    "the queue for everyone). Retry after some finish."
                )
            self._waiting[client] = count + 1
        return WaitingTicket(self, client)

    def _leave(self, client: str) -> None:
        with self._lock:
            count = self._waiting.get(client, 0) - 1
            if count > 0:
                self._waiting[client] = count
            else:
                self._waiting.pop(client, None)  # the map holds only clients with requests waiting
