"""The proxy's configuration: one frozen `ProxyConfig`, read in one place.

Every setting has a config file key (TOML or JSON file given with `--config` /
`PRISM_CONFIG`) and a `PRISM_*` environment variable; on the command line, the settings
of `FLAGS` have flags of their own and any setting can be given as `--set KEY=VALUE`.
Precedence: command line > environment > file > default. The QAS parameters (SPEC §2,
§5) are generated from `QasParams`'s fields, so a new parameter gets its key and
variable for free. Automatic values (B, the backstop, the replica count) are `None`,
written `auto`.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from prism_proxy.admission.pieces import MIN_PIECE_TOKENS
from prism_proxy.admission.sessions import SessionParams
from prism_proxy.prompts.extraction import ALL_LAYOUTS as EXTRACTION_LAYOUTS
from prism_proxy.qas.params import DEFAULT_QAS_VARIANT, QAS_VARIANTS, QasParams, qas_params
from prism_proxy.qas.policies import POLICIES
from prism_wire.secret import SecretError, read_secret

POLICY_NAMES = tuple(POLICIES)  # the registry's names: prism, fifo, klpm, contextpilot-style
RESIDENCY_SOURCES = ("auto", "dart", "view")
GRAMMAR_POLICIES = ("off", "checked", "on")
ACCESS_LOGS = ("off", "text", "json")  # the access log's form (docs/observability.md)
TRACING_MODES = ("auto", "off")  # OpenTelemetry spans: when the package is installed, or never
TOKENIZER_MISMATCH = ("refuse", "forward")  # what a tokenizer unlike the engine's leads to
ENV_PREFIX = "PRISM_"
# Settings whose value may be automatic (None, written "auto").
AUTOMATIC = (
    "prefill_batch", "max_inflight", "backend_replicas", "max_decode_tokens",
    "max_client_decode_tokens", "max_client_connections", "prefill_piece_tokens",
)  # fmt: skip
OFF_BY_ZERO = ("prefill_piece_tokens",)  # automatic settings that 0 turns off
# The settings with a flag of their own; every other one is `--set KEY=VALUE`.
FLAGS = (
    "backend", "host", "port", "tokenizer", "policy", "qas_variant", "control_url",
    "prefill_batch", "window_ms", "max_queue", "metrics_listen", "log_level",
    "access_log", "control_token_file", "engine_api_key_file",
)  # fmt: skip
# Secrets: from the environment, a config file or a `*_file` setting naming a file,
# never a flag or a `--set` value (a process's argv is world-readable in /proc/<pid>/cmdline).
# `api_keys_file` is a file of hashed keys in its own form (`edge.keys`), not the secret.
SECRETS = ("control_token", "engine_api_key", "api_keys")
SECRET_FILES = ("control_token", "engine_api_key")  # `*_file` holds the secret itself


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting and where it came from."""


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:9100` for IPv6; port 0: any free port) of a listener."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"metrics_listen: expected HOST:PORT, got {text!r}")
    return host, int(port_text)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Settings of `prism-proxy serve` (see docs/proxy.md for the reference table)."""

    backend: str = "http://127.0.0.1:30000"
    host: str = "127.0.0.1"
    port: int = 8000
    tokenizer: str = "auto"
    tokenizer_mismatch: str = "refuse"
    policy: str = "prism"
    qas_variant: str = DEFAULT_QAS_VARIANT
    residency: str = "auto"
    prefill_batch: int | None = None
    max_inflight: int | None = None
    prefill_piece_tokens: int | None = None
    window_ms: float = 10.0
    max_queue: int = 10_000
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_chars: int = 1_000_000
    max_messages: int = 4096
    max_segments: int = 256
    grammars: str = "off"
    max_decode_tokens: int | None = None
    max_client_decode_tokens: int | None = None
    max_answer_bytes: int = 16 * 1024 * 1024
    share_min_clients: int = 2
    rendering_check_every: int = 16
    share_cache_bytes: int = 32 * 1024 * 1024
    segment_cache_bytes: int = 64 * 1024 * 1024
    head_cache_bytes: int = 16 * 1024 * 1024
    chat_cache_bytes: int = 32 * 1024 * 1024
    header_timeout_s: float = 60.0
    body_timeout_s: float = 60.0
    keepalive_timeout_s: float = 75.0
    send_timeout_s: float = 60.0
    max_connections: int = 4096
    metrics_listen: str | None = None
    extraction: str = "xml,numbered,markdown,dashed,blank"
    extraction_reorder: bool = True
    evidence_cache_bytes: int = 16 * 1024 * 1024
    control_url: str | None = None
    control_token: str | None = field(default=None, repr=False)
    backend_replicas: int | None = None
    # The engine's own API key (SGLang's `--api-key`), sent as `Authorization: Bearer`
    # on every request to the engine; kept out of the repr so no log shows it.
    engine_api_key: str | None = field(default=None, repr=False)
    engine_api_key_file: str | None = None
    control_token_file: str | None = None
    protect: int = 8
    sessions: bool = True
    session_ttl_quantile: float = 0.9
    session_max_ttl_s: float = 60.0
    session_rank: str = "recent"
    backend_timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    health_interval_s: float = 5.0
    shutdown_timeout_s: float = 30.0
    retry_after_s: int = 1
    # Client API keys and per-key limits (docs/keys.md). `api_keys` is a secret: from the
    # environment (PRISM_API_KEYS) or the config file only, never the command line.
    api_keys_file: str | None = None
    api_keys: str | None = field(default=None, repr=False)
    key_max_inflight: int = 0
    key_max_queued: int = 0
    key_tokens_per_minute: int = 0
    fair_share: bool = True
    log_level: str = "info"
    # --- probes and tracing (docs/observability.md) ---
    ready_interval_s: float = 1.0
    drain_delay_s: float = 0.0
    access_log: str = "off"
    tracing: str = "auto"
    # --- end of probes and tracing ---
    # --- one client's share (docs/limits.md): connections, and the engine's grammar
    # compiler (a schema's size, new grammars at once and per minute) ---
    max_client_connections: int | None = None
    max_schema_bytes: int = 32 * 1024
    max_client_grammar_compiles: int = 2
    max_client_grammars_per_minute: int = 10
    # --- end of one client's share ---
    qas: QasParams = field(default_factory=lambda: qas_params(DEFAULT_QAS_VARIANT))
    # Derived from `extraction` once, not per request: the layouts looked for in
    # requests without hints (none: off).
    extraction_layouts: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = self.extraction.strip()
        layouts = (
            ()
            if text in ("", "off", "none")
            else tuple(name.strip() for name in text.split(",") if name.strip())
        )
        object.__setattr__(self, "extraction_layouts", layouts)
        if self.policy not in POLICY_NAMES:
            raise ConfigError(f"policy: unknown {self.policy!r}; choose one of {POLICY_NAMES}")
        if self.qas_variant not in QAS_VARIANTS:
            choices = tuple(QAS_VARIANTS)
            raise ConfigError(f"qas: unknown variant {self.qas_variant!r}; choose one of {choices}")
        if self.tokenizer_mismatch not in TOKENIZER_MISMATCH:
            raise ConfigError(
                f"tokenizer_mismatch: unknown {self.tokenizer_mismatch!r}; choose one of "
                f"{TOKENIZER_MISMATCH}"
            )
        if self.residency not in RESIDENCY_SOURCES:
            raise ConfigError(
                f"residency: unknown {self.residency!r}; choose one of {RESIDENCY_SOURCES}"
            )
        if self.grammars not in GRAMMAR_POLICIES:
            raise ConfigError(
                f"grammars: unknown {self.grammars!r}; choose one of {GRAMMAR_POLICIES}"
            )
        # --- probes and tracing ---
        if self.access_log not in ACCESS_LOGS:
            raise ConfigError(
                f"access_log: unknown {self.access_log!r}; choose one of {ACCESS_LOGS}"
            )
        if self.tracing not in TRACING_MODES:
            raise ConfigError(f"tracing: unknown {self.tracing!r}; choose one of {TRACING_MODES}")
        for name in ("ready_interval_s", "drain_delay_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0, got {getattr(self, name)}")
        # --- end of probes and tracing ---
        if self.residency == "dart" and self.control_url is None:
            raise ConfigError("residency: 'dart' needs --control-url (DART's control RPC)")
        try:
            self.session_params()
        except ValueError as exc:
            raise ConfigError(f"session settings: {exc}") from None
        positive = (
            "max_queue", "max_body_bytes", "max_prompt_chars", "max_messages", "max_segments",
            "segment_cache_bytes", "head_cache_bytes", "chat_cache_bytes", "header_timeout_s",
            "body_timeout_s", "keepalive_timeout_s", "send_timeout_s", "max_connections",
            "evidence_cache_bytes", "max_answer_bytes", "share_min_clients", "share_cache_bytes",
            "backend_timeout_s", "max_schema_bytes", "max_client_grammar_compiles",
            "max_client_grammars_per_minute",
        )  # fmt: skip
        for name in (*positive, "connect_timeout_s", "shutdown_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be > 0, got {getattr(self, name)}")
        for name in (
            "window_ms", "protect", "health_interval_s", "retry_after_s", "rendering_check_every",
            "key_max_inflight", "key_max_queued", "key_tokens_per_minute",
        ):  # fmt: skip
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in AUTOMATIC:
            value = getattr(self, name)
            if value is not None and value < 1 and not (value == 0 and name in OFF_BY_ZERO):
                raise ConfigError(f"{name}: must be 'auto' or >= 1, got {value}")
        pieces = self.prefill_piece_tokens
        if pieces is not None and 0 < pieces < MIN_PIECE_TOKENS:
            raise ConfigError(
                f"prefill_piece_tokens: must be 'auto', 0 (off) or >= {MIN_PIECE_TOKENS}, "
                f"got {pieces}"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port: out of range: {self.port}")
        if self.metrics_listen is not None:
            parse_listen(self.metrics_listen)
        unknown = set(self.extraction_layouts) - set(EXTRACTION_LAYOUTS)
        if unknown:
            raise ConfigError(
                f"extraction: unknown layout(s) {', '.join(sorted(unknown))}; choose from "
                f"{', '.join(EXTRACTION_LAYOUTS)}, or 'off'"
            )
        for name in ("engine_api_key", "control_token"):
            secret = getattr(self, name)
            # Sent in a header: printable ASCII without spaces, so it cannot split one.
            if secret is not None and not (secret.isascii() and secret.isprintable()):
                raise ConfigError(f"{name}: must be printable ASCII")
            if secret is not None and (not secret or " " in secret):
                raise ConfigError(f"{name}: must be non-empty, without spaces")
        if not self.backend.startswith(("http://", "https://")):
            raise ConfigError(f"backend: expected an http(s) URL, got {self.backend!r}")

    @property
    def backend_url(self) -> str:
        return self.backend.rstrip("/")

    def session_params(self) -> SessionParams:
        """The session table's parameters (`sessions`)."""
        return SessionParams(
            ttl_quantile=self.session_ttl_quantile,
            max_ttl_s=self.session_max_ttl_s,
            rank=self.session_rank,
        )

    @property
    def control_urls(self) -> list[str]:
        """Every DART control RPC to push to: `control_url` may list several, comma
        separated (one PRISM proxy in front of a gateway and N replicas)."""
        if not self.control_url:
            return []
        return [url.strip() for url in self.control_url.split(",") if url.strip()]

    @property
    def replicas(self) -> int:
        """Engines behind the backend URL: `backend_replicas`, else one per control RPC
        (a gateway in front of N replicas, each with its DART), else 1."""
        if self.backend_replicas is not None:
            return self.backend_replicas
        return max(1, len(self.control_urls))

    @property
    def client_connections(self) -> int:
        """One client's connection cap: `max_client_connections`, else (auto) half of
        `max_connections`."""
        if self.max_client_connections is not None:
            return self.max_client_connections
        return max(1, self.max_connections // 2)

    @property
    def window_s(self) -> float:
        return self.window_ms / 1000.0


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its `ProxyConfig` field (or QAS parameter), flag and parser."""

    name: str
    parse: Callable[[str], Any]
    help: str
    default: Any = None
    qas: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def key(self) -> str:
        """The config-file key."""
        return _PUBLIC_NAMES.get(self.name, self.name)


# Settings whose flag, variable and file key differ from the field name.
_PUBLIC_NAMES = {"qas_variant": "qas"}


def _optional_str(text: str) -> str | None:
    return text or None


_HELP = {
    "backend": "base URL of the SGLang server or the simulated engine",
    "host": "address to listen on",
    "port": "port to listen on",
    "tokenizer": "'auto' (the engine's: its model directory when readable here, else "
    "'builtin', whichever tokenizes as the engine does), 'builtin', or a model directory; "
    "checked against the engine's own tokenization",
    "tokenizer_mismatch": "when the tokenizer does not tokenize as the engine does: refuse "
    "(the proxy does not start; at run time, requests that need it get 503) or forward "
    "(they go to the engine's own endpoints)",
    "policy": f"admission policy: {'|'.join(POLICY_NAMES)}",
    "qas_variant": f"QAS variant of policy prism: {'|'.join(QAS_VARIANTS)} ('paper': the "
    "paper's QAS; explicit QAS parameters apply on top)",
    "residency": "where prism learns which segments the backend holds: auto (DART when "
    "--control-url is set, else the proxy's own cache view), dart, view",
    "prefill_batch": "B: released requests that may await their first token at once "
    "(auto: the backend's prefill budget / observed uncached tokens per request)",
    "max_inflight": "backstop on released, unfinished requests (auto: the backend's "
    "max_running_requests)",
    "prefill_piece_tokens": "a released prompt with more uncached tokens than twice this "
    "is prefilled in pieces of this many tokens, one pieced prompt at a time, so short "
    "requests wait for at most one piece, not its whole prefill (auto: the engine's "
    "prefill budget per step; 0: off; docs/proxy.md)",
    "window_ms": "QAS round window Δt_win in milliseconds",
    "max_queue": "queued requests beyond which new ones get 429",
    "max_body_bytes": "largest request body accepted (413 above)",
    "max_prompt_chars": "largest prompt: characters of text (token ids count one each) over "
    "messages, prompt and hints (413 above)",
    "max_messages": "most chat messages (and content parts, tools, stop strings) in one "
    "request (413 above)",
    "max_segments": "most segments in one request's prism hint (400 above)",
    "grammars": "grammars besides JSON schemas (ebnf, regex, structural_tag): off (refused), "
    "checked (ebnf and regex served when the proxy can show that matching them costs "
    "bounded time per token, docs/proxy.md), on (served unchecked: one grammar can hold "
    "the engine's every step)",
    "max_decode_tokens": "most tokens one request may ask the engine to generate over all its "
    "sequences, n x max_tokens (auto: a quarter of the engine's KV pool; 400 above)",
    "max_client_decode_tokens": "most tokens a client's requests in flight may force or "
    "multiply (ignore_eos, min_tokens, n > 1) (auto: the engine's KV pool; 429 above)",
    "max_answer_bytes": "largest answer the proxy assembles for a client that did not ask "
    "to stream (400 when a request cannot fit it)",
    "share_min_clients": "a cached prefix a client did not send itself is reported to it "
    "(cached_tokens) once this many other clients sent it (1: every prefix, for a deployment "
    "of one tenant; docs/proxy.md)",
    "rendering_check_every": "compare every Nth chat's prompt with the engine's own rendering "
    "of it (prism:prompt_rendering_* metrics; 0: never)",
    "share_cache_bytes": "bytes of the record of who sent which prompt prefix",
    "segment_cache_bytes": "bytes of segment token ids the serializer keeps (LRU)",
    "head_cache_bytes": "bytes of rendered system-prompt heads the serializer keeps (LRU)",
    "chat_cache_bytes": "bytes of chat pieces' token ids the tokenizer keeps (LRU)",
    "header_timeout_s": "time a client has to send a request's headers, in total: from its "
    "connection opening, or from a later request's first byte (408 and close after)",
    "body_timeout_s": "time a client has to send a request's whole body, in total, from its "
    "headers (408 and close after)",
    "keepalive_timeout_s": "idle time after a response after which a kept-alive client "
    "connection is closed",
    "send_timeout_s": "longest a client may leave a response unread; then its connection is "
    "closed and its request aborted",
    "max_connections": "client connections served at once (503 and close above; lowered, "
    "with a warning, when the open-file limit cannot hold 2x it)",
    "extraction": "layouts of documents looked for in requests without hints, comma "
    "separated (xml, numbered, markdown, dashed, blank), or 'off'",
    "extraction_reorder": "may documents found in requests without hints be reordered "
    "(where their boundaries are justified)",
    "evidence_cache_bytes": "bytes of the record of which blank-line blocks travel apart "
    "(documents) or together (blocks of one); as much again for the order each tool "
    "result was first served in",
    "metrics_listen": "HOST:PORT of an admin listener serving /metrics, which then leaves "
    "the client port (port 0: any free port; unset: /metrics on the client port)",
    "control_url": "base URL of the DART control RPC, or several comma-separated (one per "
    "replica behind a gateway; unset: no pushes)",
    "control_token": "bearer token for the control RPC: PRISM_CONTROL_TOKEN or a config "
    "file, never a flag",
    "control_token_file": "file holding the control RPC's bearer token",
    "engine_api_key": "the engine's API key (SGLang's --api-key), sent as a bearer token on "
    "every request to it: PRISM_ENGINE_API_KEY or a config file, never a flag",
    "engine_api_key_file": "file holding the engine's API key",
    "backend_replicas": "engines behind --backend (a gateway): prefill pacing's budget and "
    "backstop count each replica's (auto: one per --control-url, else 1)",
    "protect": "DART protection budget f sent with each priority table",
    "sessions": "agent session features: recognise a chat with tools that continues an "
    "earlier one, ask DART (--control-url) to keep a session's history while its tool "
    "runs, and give continuations precedence in QAS (continuation_share)",
    "session_ttl_quantile": "how long DART keeps a paused session: this quantile of the "
    "return delays seen for its agent type",
    "session_max_ttl_s": "longest a paused session is kept",
    "session_rank": "which paused session DART lets go first when the pool runs short: "
    "recent (the longest-paused) or program (the youngest program; Continuum's order)",
    "backend_timeout_s": "longest silence of the backend within one request",
    "connect_timeout_s": "time allowed to connect to the backend",
    "health_interval_s": "seconds between backend health probes (0: only at start)",
    "shutdown_timeout_s": "seconds to drain in-flight requests on shutdown",
    "retry_after_s": "Retry-After seconds sent with 429",
    "api_keys_file": "file of accepted client API keys, one sha256:<hex> digest a line with "
    "optional name and per-key limits (docs/keys.md); unset, and without api_keys: no keys, "
    "each client address is its own account",
    "api_keys": "accepted client API keys (or sha256:<hex> digests), comma separated: a "
    "secret, so only from PRISM_API_KEYS or the config file, never the command line",
    "key_max_inflight": "default per key (per client address without keys): requests "
    "accepted and not yet answered (0: no limit; 429 above)",
    "key_max_queued": "default per key: requests waiting in QAS for release (0: no limit; "
    "429 above)",
    "key_tokens_per_minute": "default per key: prompt + completion tokens of its answers per "
    "minute, a token bucket (0: no limit; 429 while it is empty)",
    "fair_share": "share each QAS round's releases between the keys (client addresses without "
    "keys) with requests waiting, weighted by each key's weight; QAS orders within each share",
    "log_level": "debug|info|warning|error",
    # --- probes and tracing ---
    "ready_interval_s": "seconds between the cheap readiness probes of the backend (its "
    "/ready) behind /readyz; a failed exchange on any path marks it down at once (0: off, "
    "only the health probes of health_interval_s)",
    "drain_delay_s": "on shutdown, seconds /readyz answers 503 while the proxy still serves "
    "new requests, so that a load balancer stops sending before the listener closes",
    "access_log": "one line per request (time, request id, method, path, status, latency, "
    "TTFT, lane, client, tokens): off, text or json",
    "tracing": "OpenTelemetry spans per request (arrival, admission wait, release, first "
    "token, end): auto (when opentelemetry-api is installed, the 'otel' extra, and a tracer "
    "provider is configured at start) or off",
    # --- end of probes and tracing ---
    # --- one client's share ---
    "max_client_connections": "client connections one client (peer address) may hold open "
    "(503 and close above; auto: half of max_connections; behind a reverse proxy every "
    "client is its address: raise it to max_connections)",
    "max_schema_bytes": "largest JSON schema (response_format, json_schema, a strict tool's "
    "parameters) or grammar a request may ask the engine to compile (400 above)",
    "max_client_grammar_compiles": "requests of one client whose grammar the engine has not "
    "compiled yet that may be in flight at once (429 with Retry-After above)",
    "max_client_grammars_per_minute": "grammars new to the engine one client may introduce "
    "per minute (each grows the engine's grammar cache; 429 with Retry-After above)",
    # --- end of one client's share ---
}
_QAS_HELP = {
    "f_front": "QAS f_front: segments moved to the front",
    "kappa": "QAS κ: signature size",
    "q_cold": "QAS cold-lane slots per wave",
    "alpha_size": "QAS bucket-size weight α_size",
    "beta_util": "QAS utility weight β_util",
    "w_a": "P_t weight of active requests",
    "w_n": "P_t weight of the next batch",
    "w_g": "P_t weight of queued requests",
    "k": "k-LPM group size (policy klpm)",
    "cache_view_bytes": "memory the approximate cache view may take in the proxy",
    "cache_view_tokens": "capacity of the approximate cache view (baselines; prism's "
    "residency without DART)",
    "canonical_ties": "break equal QAS priorities by a global segment order (not position)",
    "w_c": "P_t weight of residency (0: off)",
    "cold_deadline_ms": "admission wait after which a request heads the cold lane (0: off)",
    "cold_max_fraction": "largest share of a wave the cold lane grows to for late requests",
    "continuation_share": "share of the hot lane that continuations of paused agent "
    "sessions take first, oldest program first (with --set sessions=true; 0: off)",
}


def _automatic(text: str) -> int | None:
    text = text.strip().lower()
    return None if text == "auto" else int(text)


def _parser_for(name: str, default: Any, optional: bool) -> Callable[[str], Any]:
    if name in AUTOMATIC:
        return _automatic
    if optional:
        return _optional_str
    if isinstance(default, bool):
        return lambda text: text.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    return str


def options() -> list[Option]:
    """All settings, proxy ones first, then the QAS parameters."""
    result: list[Option] = []
    base = ProxyConfig()
    for f in fields(ProxyConfig):
        if f.name == "qas" or not f.init:
            continue
        default = getattr(base, f.name)
        parse = _parser_for(f.name, default, optional="None" in str(f.type))
        result.append(Option(f.name, parse, _HELP.get(f.name, f.name), default))
    qas_defaults = qas_params(DEFAULT_QAS_VARIANT)
    for name in QasParams.field_names():
        parse = _parser_for(name, getattr(qas_defaults, name), False)
        help_text = _QAS_HELP.get(name, f"QAS parameter {name}")
        result.append(Option(name, parse, help_text, getattr(qas_defaults, name), qas=True))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `FLAGS`, `--config` and `--set`; unset flags stay absent (SUPPRESS)
    for precedence."""
    parser.add_argument("--config", default=argparse.SUPPRESS, help="TOML or JSON config file")
    for option in options():
        if option.name not in FLAGS:
            continue
        default = option.default
        if default is None:
            default = "auto" if option.name in AUTOMATIC else "unset"
        parser.add_argument(
            option.flag,
            dest=option.name,
            type=option.parse,
            default=argparse.SUPPRESS,
            help=f"{option.help} (default {default})",
        )
    parser.add_argument(
        "--set",
        dest="set",
        action="append",
        metavar="KEY=VALUE",
        default=argparse.SUPPRESS,
        help="any other setting, by its config file key (repeatable; docs/proxy.md lists "
        "them all, with their PRISM_* variables)",
    )


def _set_values(pairs: Sequence[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs as settings, each parsed like its environment variable."""
    known = {option.key: option for option in options()}
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        option = known.get(key)
        if not sep or option is None:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE with a setting's key")
        if option.name in SECRETS:
            raise ConfigError(
                f"--set {key}: a secret is never given on the command line (readable by "
                f"every local user): set {option.env} or {option.env}_FILE"
            )
        values[option.name] = _coerce(option, text, "--set")
    return values


def _read_secrets(values: dict[str, Any]) -> None:
    """Fill `control_token` and `engine_api_key` from their `*_file` settings (the file's
    text without surrounding whitespace); a secret given both ways is an error."""
    for name in SECRET_FILES:
        if values.get(f"{name}_file") is None:
            continue  # no file: a direct value stays as given, for `ProxyConfig` to check
        try:
            values[name] = read_secret(values, name, file_suffix="_file")
        except SecretError as exc:
            raise ConfigError(str(exc)) from None


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML (`.toml`) or JSON config file into a flat mapping of settings.

    Keys use the flag names with `_` or `-` (`max_inflight`, `max-inflight`); QAS
    parameters may also sit in a `[qas]` table.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config: cannot parse {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a table/object")
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key == "qas" and isinstance(value, str):
            flat["qas_variant"] = value
        elif key == "qas" and isinstance(value, dict):
            flat.update({k.replace("-", "_"): v for k, v in value.items()})
        else:
            flat[key.replace("-", "_")] = value
    return flat


def _coerce(option: Option, value: Any, source: str) -> Any:
    """Parse a string (env) or check a typed value (file)."""
    try:
        if isinstance(value, str):
            return option.parse(value)
        if value is None:
            return None
        if isinstance(value, bool) and option.parse in (int, float):
            raise TypeError("boolean")
        return option.parse(str(value)) if option.parse in (int, float) else value
    except (TypeError, ValueError):
        raise ConfigError(f"{option.name} (from {source}): bad value {value!r}") from None


def build_config(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProxyConfig:
    """Merge flags > environment > config file > defaults into a `ProxyConfig`."""
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ
    config_path = flags.pop("config", None) or environ.get(ENV_PREFIX + "CONFIG")
    flags = {**_set_values(flags.pop("set", None) or []), **flags}
    file_values = load_file(config_path) if config_path else {}
    known = {option.name: option for option in options()}
    unknown = sorted(set(file_values) - set(known))
    if unknown:
        raise ConfigError(f"config: unknown setting(s) {', '.join(unknown)}")

    values: dict[str, Any] = {}
    for name, option in known.items():
        if name in flags:
            values[name] = flags[name]
        elif option.env in environ:
            values[name] = _coerce(option, environ[option.env], option.env)
        elif name in file_values:
            values[name] = _coerce(option, file_values[name], f"config {config_path}")
    _read_secrets(values)
    qas_values = {k: v for k, v in values.items() if known[k].qas}
    proxy_values = {k: v for k, v in values.items() if not known[k].qas}
    try:
        variant = proxy_values.get("qas_variant", DEFAULT_QAS_VARIANT)
        if variant not in QAS_VARIANTS:
            raise ConfigError(
                f"qas: unknown variant {variant!r}; choose one of {tuple(QAS_VARIANTS)}"
            )
        qas = qas_params(variant, qas_values)
        return replace(ProxyConfig(), qas=qas, **proxy_values)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def parse_serve_args(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> ProxyConfig:
    """Parse `serve` flags alone (used by tests and by `cli.py`)."""
    parser = argparse.ArgumentParser(prog="prism-proxy serve", allow_abbrev=False)
    add_arguments(parser)
    return build_config(vars(parser.parse_args(argv)), environ)
