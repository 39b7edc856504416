"""What every tab shares: the app context, inline messages next to controls, and number formatting."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from backend.default_model import shown_name
from backend.export.supervisor import ExternalServers
from backend.public_policy import PublicPolicy
from backend.server.app import DEFAULT_MAX_WAITING_REQUESTS, default_client_share
from backend.server.engine_holder import EngineHolder
from backend.server.fairness import ClientLine, client_id
from backend.url_guard import URLGuard

GIB = 1024**3


@dataclass(slots=True)
class AppContext:
    """Process-wide objects every tab's handlers use."""

    holder: EngineHolder
    default_model: str  # GGUF path, folder or Hub id that Launch proposes (forms show shown_model)
    api_base: str  # this server's OpenAI-compatible API, e.g. http://127.0.0.1:7860/v1
    policy: PublicPolicy = field(default_factory=PublicPolicy)  # local mode unless the app is public
    api_key: str | None = field(default=None, repr=False)  # this app's /v1 key, sent to its own API only

    @property
    def guard(self) -> URLGuard:
        """What Monitor and Benchmark may fetch: this app's own API, plus what the policy allows."""
        origin = httpx.URL(self.api_base).copy_with(path="/", query=None)
        return URLGuard(self.policy.is_public, str(origin).rstrip("/"), self.policy.allowed_urls)

    @property
    def shown_model(self) -> str:
        """The app's model as the forms show it: never a path on a public app (shown_name)."""
        return shown_name(self.default_model, self.policy.is_public)

    def model_to_load(self, name: str) -> str:
        """A model name from a form: the app's own model for the name the form showed for it."""
        name = (name or "").strip()
        return self.default_model if name == self.shown_model else name

    def client_of(self, request: Any) -> str:
        """Who sent a Gradio event (a gr.Request): the address /v1 would see (fairness.client_id)."""
        client = getattr(request, "client", None)
        headers = getattr(request, "headers", None) or {}
        return client_id(client.host if client else None, headers, self.policy.forwarded_hops)

    def key_for(self, url: str) -> str | None:
        """This app's API key when url is its own API (never sent elsewhere), else None."""
        return self.api_key if self.guard.is_own(httpx.URL(url)) else None

    external: ExternalServers = field(default_factory=ExternalServers)  # vLLM etc. started from Launch
    # each client's share of the engine's waiting queue, shared by /v1 and the UI's handlers
    clients: ClientLine = field(
        default_factory=lambda: ClientLine(default_client_share(DEFAULT_MAX_WAITING_REQUESTS))
    )


MessageKind = Literal["error", "ok", "info"]
ICONS: dict[str, str] = {"error": "⚠ ", "ok": "✓ ", "info": ""}


def message(
    kind: MessageKind,
    text: str = "",
    *,
    body_html: str | None = None,
    elem_id: str = "",
    data: dict[str, object] | None = None,
) -> str:
    """The one inline message box every tab uses: the text escaped (or body_html, already safe), the
    kind's colours and icon, an optional id and data- attributes (what the browser tests read)."""
    attrs = f" id='{elem_id}'" if elem_id else ""
    attrs += "".join(f" data-{key}='{html.escape(str(value))}'" for key, value in (data or {}).items())
    body = body_html if body_html is not None else html.escape(text)
    return f"<div class='msg msg-{kind}'{attrs}>{ICONS[kind]}{body}</div>"


def error_message(text: str) -> str:
    return message("error", text)


def ok_message(text: str) -> str:
    return message("ok", text)


def info_message(text: str) -> str:
    return message("info", text)


def form_values(components: dict[str, Any], data: dict[Any, Any]) -> dict[str, Any]:
    """A handler's dict input (component -> value, Gradio's `inputs={...}` form) by field name."""
    return {name: data[component] for name, component in components.items()}


def describe(exc: BaseException) -> str:
    """One readable line for an exception: the message alone for input errors, else with its type."""
    if isinstance(exc, ValueError | KeyError):  # UserError (backend/errors.py) is a ValueError
        return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return f"{type(exc).__name__}: {exc}"


def optional_int(value: float | str | None, name: str, minimum: int = 1, auto: int = 0) -> int | None:
    """A form number where `auto` (or empty) means automatic (None); else a whole number >= minimum,
    or ValueError naming the field."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a whole number >= {minimum} (or {auto} for automatic), got {value!r}"
        ) from None
    if number == auto:
        return None
    if number != int(number) or number < minimum:
        raise ValueError(
            f"{name} must be a whole number >= {minimum} (or {auto} for automatic), got {number:g}"
        )
    return int(number)


def required_int(value: float | str | None, name: str, minimum: int = 1) -> int:
    """A form number that must be a whole number >= minimum."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}") from None
    if number != int(number) or number < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {number:g}")
    return int(number)


def required_float(
    value: float | str | None, name: str, minimum: float | None = None, note: str = ""
) -> float:
    """A form number that may have decimals, at least minimum when given; ValueError naming the field (an
    empty box sends None). note says what a special value means, e.g. " (0 = no target)"."""
    allowed = "a number" if minimum is None else f"a number >= {minimum:g}"
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {allowed}{note}, got {value!r}") from None
    if math.isnan(number) or (minimum is not None and number < minimum):
        raise ValueError(f"{name} must be {allowed}{note}, got {number:g}")
    return number


def gib(nbytes: float | None) -> str:
    return "–" if nbytes is None else f"{nbytes / GIB:,.2f} GiB"


def tok_s(rate: float | None) -> str:
    return "–" if rate is None else f"{rate:,.1f} tok/s"


def ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:,.0f} ms"


def usd_per_m(cost: float | None) -> str:
    """Dollars per million tokens; under a cent with two significant digits, so a small model's cost
    never reads as $0.000."""
    if cost is None:
        return "–"
    digits = 3 if cost == 0 or cost >= 0.01 else 1 - math.floor(math.log10(cost))
    return f"${cost:,.{digits}f} / 1M tok"


def count(value: float | None) -> str:
    """A number of things (requests, blocks): whole, even when a /metrics gauge sends it as a float."""
    return "–" if value is None else f"{value:,.0f}"


def percent(fraction: float | None) -> str:
    return "–" if fraction is None else f"{fraction * 100:.1f} %"
