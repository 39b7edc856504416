"""PublicPolicy: what a visitor of a publicly hosted app may load, fetch, control and ask for.

One dataclass, read once from the command line and the environment, checked at every boundary a visitor
reaches (each Gradio handler is a public API, so the handlers check it, not only the page; handlers a
visitor must never reach are not registered at all in public mode). Local mode (`PublicPolicy()`) allows
everything. Public mode is on with `python app.py --public`, `PLAYGROUND_PUBLIC=1`, on a Hugging Face
Space (its variables, `SPACE_ID`), and whenever the app is exposed: `--share`, or a `--host` other than
loopback, unless its owner says `--unsafe-local`.
"""

from __future__ import annotations

import fnmatch
import hmac
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from backend.errors import UserError

# A Space's runtime sets these (https://huggingface.co/docs/hub/spaces-overview#helper-environment-variables)
SPACE_VARIABLES = ("SPACE_ID", "SPACE_HOST", "SPACE_REPO_NAME")
# Hub ids as huggingface_hub validates them: [org/]name of letters, digits, "-", "_", "."; no "--" or "..".
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
GB = 10**9
# cpu-basic Spaces have 16 GB of RAM (huggingface.co/pricing#spaces); the engine keeps bf16 weights, or
# fp32 (2x a bf16 checkpoint) on CPUs without fast bf16, so a 3 GB checkpoint needs about 6 GB loaded.
DEFAULT_MAX_MODEL_GB = 3.0


class Forbidden(UserError):
    """A visitor asked for something public mode does not allow; the message says what is allowed."""


def _env_number(environ: Mapping[str, str], name: str, default: Any, kind: type) -> Any:
    """A positive number from the environment (int or float as the field is), default when unset."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = 0
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a {'whole ' if kind is int else ''}number > 0, got {text!r}")
    return value


def _limit(default: float, variable: str) -> Any:
    return field(default=default, metadata={"env": variable})


@dataclass(slots=True, frozen=True)
class PublicPolicy:
    """Local mode by default; `from_env` builds the policy the app runs with. Each limit field names the
    environment variable that sets it."""

    is_public: bool = False
    admin_token: str | None = field(default=None, repr=False)  # PLAYGROUND_ADMIN_TOKEN
    allowed_urls: tuple[str, ...] = ()  # PLAYGROUND_ALLOWED_URLS: URL prefixes, "*" = any public address
    max_model_gb: float = _limit(DEFAULT_MAX_MODEL_GB, "PLAYGROUND_MAX_MODEL_GB")  # Hub download size
    max_bench_requests: int = _limit(64, "PLAYGROUND_MAX_BENCH_REQUESTS")
    max_concurrency: int = _limit(8, "PLAYGROUND_MAX_CONCURRENCY")  # of a benchmark
    max_load_requests: int = _limit(32, "PLAYGROUND_MAX_LOAD_REQUESTS")  # the chat's load button
    max_tokens: int = _limit(512, "PLAYGROUND_MAX_TOKENS")  # output of a chat, load or benchmark request
    max_input_tokens: int = _limit(2048, "PLAYGROUND_MAX_INPUT_TOKENS")  # a /v1, Chat or benchmark prompt
    # each client's share of the engine's 256-request waiting queue: the load button's 32 fit in it
    max_client_waiting: int = _limit(32, "PLAYGROUND_MAX_CLIENT_WAITING")
    max_upload_mb: float = _limit(1.0, "PLAYGROUND_MAX_UPLOAD_MB")  # one file sent to Gradio's upload
    max_uploads: int = _limit(16, "PLAYGROUND_MAX_UPLOADS")  # files per client per hour
    # trusted proxies in front (a Space's is one): the client is the address they add to X-Forwarded-For
    forwarded_hops: int = _limit(0, "PLAYGROUND_FORWARDED_HOPS")

    @classmethod
    def from_env(
        cls,
        public: bool = False,
        environ: Mapping[str, str] | None = None,
        exposed_by: str | None = None,
        unsafe_local: bool = False,
    ) -> PublicPolicy:
        """Public when asked (--public, PLAYGROUND_PUBLIC=1), on a Space, or when ``exposed_by`` names
        how others can reach the app (exposure()) and the owner did not say ``unsafe_local``; limits
        from PLAYGROUND_*."""
        env = os.environ if environ is None else environ
        forced = env.get("PLAYGROUND_PUBLIC", "").strip().lower() in ("1", "true", "yes")
        on_space = any(env.get(name) for name in SPACE_VARIABLES)
        exposed = exposed_by is not None and not unsafe_local
        if not (public or forced or on_space or exposed):
            return cls()
        urls = tuple(u.strip() for u in env.get("PLAYGROUND_ALLOWED_URLS", "").split(",") if u.strip())
        limits: dict[str, Any] = {
            f.name: _env_number(env, f.metadata["env"], f.default, type(f.default))
            for f in fields(cls)
            if "env" in f.metadata
        }
        return cls(True, env.get("PLAYGROUND_ADMIN_TOKEN") or None, urls, **limits)

    @property
    def max_model_bytes(self) -> int:
        return int(self.max_model_gb * GB)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    def describe(self) -> str:
        """One line for the startup banner: the mode and what it locks."""
        if not self.is_public:
            return "local mode (nothing locked: every model, URL and engine control is allowed)"
        control = "admin token required" if self.admin_token else "disabled (no PLAYGROUND_ADMIN_TOKEN)"
        urls = ", ".join(self.allowed_urls) or "none"
        return (
            f"public mode: engine launch/stop {control}; trust_remote_code refused; models: Hub ids of at "
            f"most {self.max_model_gb:g} GB; Monitor/Benchmark reach this app's /v1 and /metrics, "
            f"plus {urls}; per request: {self.max_bench_requests} benchmark requests, "
            f"{self.max_load_requests} load requests, {self.max_tokens} tokens"
        )

    def check_admin(self, token: str | None) -> None:
        """Engine control (launch, stop, relaunch): anyone locally; in public mode only with the token."""
        if not self.is_public:
            return
        if not self.admin_token:
            raise Forbidden(
                "engine control is disabled on this public app: its owner has not set PLAYGROUND_ADMIN_TOKEN"
            )
        if not hmac.compare_digest((token or "").encode(), self.admin_token.encode()):
            raise Forbidden("engine control needs the admin token (the owner's PLAYGROUND_ADMIN_TOKEN)")

    def check_trust_remote_code(self, trust_remote_code: bool) -> None:
        if self.is_public and trust_remote_code:
            raise Forbidden("trust_remote_code is refused in public mode: it would run the model repo's code")

    def check_model_name(self, model: str, presets: tuple[str, ...] = ()) -> None:
        """A model a visitor names: in public mode a preset (the owner's) or a Hub id, never a path.

        The message is the same whether or not a path exists, so it tells nothing about the filesystem."""
        if not self.is_public or model in presets:
            return
        shape_ok = HUB_ID.match(model) and ".." not in model and "--" not in model
        # A relative path shaped like a Hub id is refused with the same words as any other path.
        if not shape_ok or model.endswith(".gguf") or Path(model).exists():
            raise Forbidden(
                f"public mode loads models from the Hugging Face Hub only: give an id such as "
                f"HuggingFaceTB/SmolLM2-135M-Instruct (local paths and files are not allowed), got {model!r}"
            )

    def check_model_size(self, repo_id: str, model_info: Callable[..., Any] | None = None) -> int:
        """The download size of a Hub model (the files the loader fetches), read from the Hub's metadata
        before anything is downloaded; Forbidden above max_model_bytes. Returns the size in bytes."""
        try:
            info = (model_info or hub_model_info)(repo_id, files_metadata=True, timeout=10)
        except Exception as exc:  # offline, no such repo, gated: the launch cannot go on either way
            reason = type(exc).__name__
            raise ValueError(f"cannot read {repo_id}'s file sizes from the Hub ({reason})") from None
        size = download_bytes(info.siblings or [])
        if size > self.max_model_bytes:
            raise Forbidden(
                f"{repo_id} downloads {size / GB:.2f} GB; this public app allows models up to "
                f"{self.max_model_gb:g} GB (PLAYGROUND_MAX_MODEL_GB)"
            )
        return size

    def limit(self, value: int, knob: str, name: str) -> int:
        """value, or Forbidden naming ``name`` when it exceeds the public-mode maximum ``knob`` (a field)."""
        maximum = getattr(self, knob)
        if self.is_public and value > maximum:
            variable = next(f.metadata["env"] for f in fields(self) if f.name == knob)
            raise Forbidden(f"{name} must be at most {maximum} on this public app ({variable}), got {value}")
        return value


def exposure(host: str, share: bool) -> str | None:
    """How others can reach an app bound to ``host`` (with a share link or not), or None when only this
    machine can: loopback addresses and "localhost"; any other name or address is reachable."""
    if share:
        return "--share (a public gradio.live link)"
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a host name: it resolves to whatever the network says
        pass
    return f"--host {host} (other machines can connect)"


def exposure_notice(exposed_by: str | None, policy: PublicPolicy) -> str | None:
    """The startup warning about exposure, either way; None on loopback."""
    if exposed_by is None:
        return None
    if policy.is_public:
        return (
            f"* Exposed by {exposed_by}: public mode is on (visitors get its limits). Only on a network "
            "you trust, --unsafe-local keeps local mode."
        )
    return (
        f"* WARNING: exposed by {exposed_by} in local mode (--unsafe-local): whoever reaches it may load "
        "any model or local path, start engines, and fetch any URL from this machine."
    )


def hub_model_info(repo_id: str, **kwargs: Any) -> Any:
    from huggingface_hub import model_info  # the Hub client loads only when a public launch needs it

    return model_info(repo_id, **kwargs)


def download_bytes(siblings: list[Any]) -> int:
    """Bytes the engine's loader downloads from a repo: the files matching its allow patterns."""
    from backend.engine.loader import HUB_ALLOW_PATTERNS

    total = 0
    for sibling in siblings:
        if any(fnmatch.fnmatch(sibling.rfilename, pattern) for pattern in HUB_ALLOW_PATTERNS):
            if sibling.size is None:
                raise ValueError(f"the Hub did not report the size of {sibling.rfilename}")
            total += sibling.size
    return total
