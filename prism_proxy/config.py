"""The proxy's configuration: one frozen `ProxyConfig` and the checks of its values.

How a setting is given (flag, `PRISM_*` variable, config file, `--set`) and read into a
`ProxyConfig` is `options.py`'s job. Automatic values (B, the backstop, the replica
count) are `None`, written `auto`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prism_proxy.admission.pieces import MIN_PIECE_TOKENS
from prism_proxy.admission.sessions import SessionParams
from prism_proxy.api.segments import MAX_SEGMENTS
from prism_proxy.prompts.extraction import ALL_LAYOUTS as EXTRACTION_LAYOUTS
from prism_proxy.qas.params import DEFAULT_QAS_VARIANT, QAS_VARIANTS, QasParams, qas_params
from prism_proxy.qas.policies import POLICIES

POLICY_NAMES = tuple(POLICIES)  # the registry's names: prism, fifo, klpm, contextpilot-style
RESIDENCY_SOURCES = ("auto", "dart", "view")
GRAMMAR_POLICIES = ("off", "checked", "on")
ACCESS_LOGS = ("off", "text", "json")  # the access log's form (docs/observability.md)
TRACING_MODES = ("auto", "off")  # OpenTelemetry spans: when the package is installed, or never
TOKENIZER_MISMATCH = ("refuse", "forward")  # what a tokenizer unlike the engine's leads to
# Settings whose value may be automatic (None, written "auto").
AUTOMATIC = (
    "prefill_batch", "max_inflight", "backend_replicas", "max_decode_tokens",
    "max_client_decode_tokens", "max_client_connections", "prefill_piece_tokens",
)  # fmt: skip
OFF_BY_ZERO = ("prefill_piece_tokens",)  # automatic settings that 0 turns off


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
    session_min_ttl_s: float = 0.5
    session_default_ttl_s: float = 10.0
    session_credit_half_life_s: float = 60.0
    session_rank: str = "recent"
    session_retain_from: str = "end"
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
        if self.max_segments > MAX_SEGMENTS:  # the hint model's own bound refuses more
            raise ConfigError(
                f"max_segments: at most {MAX_SEGMENTS} (a hint's prompt holds no more), "
                f"got {self.max_segments}"
            )
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
            min_ttl_s=self.session_min_ttl_s,
            default_ttl_s=self.session_default_ttl_s,
            credit_half_life_s=self.session_credit_half_life_s,
            rank=self.session_rank,
            retain_from=self.session_retain_from,
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
