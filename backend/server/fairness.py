"""Per-client share of the waiting queue: one client cannot fill the queue for everyone.

A request counts as waiting for its client from the moment the server takes it (before tokenizing and
compiling, which have lines of their own) until its first output, its end, or its refusal. A batch of
prompts (one HTTP request, one engine request per prompt) holds one place per prompt, each given back
when its prompt starts. A client with ``max_waiting_per_client`` requests waiting gets 503 + Retry-After
for the next one; everyone else is still admitted while the engine's own queue (max_waiting_requests)
has room.

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
    """One request's places in its client's share (one per engine request it makes: a batch of prompts
    holds one per prompt); leave() gives back all it still holds, leave(1) one of them. Idempotent."""

    __slots__ = ("_line", "client", "held")

    def __init__(self, line: ClientLine, client: str, count: int = 1) -> None:
        self._line, self.client, self.held = line, client, count

    def leave(self, count: int | None = None) -> None:
        self._line._leave(self, count)

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

    def enter(self, client: str, count: int = 1) -> WaitingTicket:
        """A ticket for ``count`` more waiting requests of ``client`` (a batch of prompts), or
        ClientShareExceeded. A caller refuses a batch larger than the whole share itself (it never fits)."""
        with self._lock:
            waiting = self._waiting.get(client, 0)
            if waiting + count > self.max_waiting_per_client:
                batch = f", and this request's {count} prompts would wait too" if count > 1 else ""
                raise ClientShareExceeded(
                    f"Too many requests from this client: {waiting} are waiting to start{batch} (each client "
                    f"may have at most {self.max_waiting_per_client} waiting, so that one client cannot fill "
                    "the queue for everyone). Retry after some finish."
                )
            self._waiting[client] = waiting + count
        return WaitingTicket(self, client, count)

    def _leave(self, ticket: WaitingTicket, count: int | None) -> None:
        with self._lock:
            given = ticket.held if count is None else min(count, ticket.held)
            if given <= 0:
                return
            ticket.held -= given
            waiting = self._waiting.get(ticket.client, 0) - given
            if waiting > 0:
                self._waiting[ticket.client] = waiting
            else:
                self._waiting.pop(ticket.client, None)  # the map holds only clients with requests waiting
