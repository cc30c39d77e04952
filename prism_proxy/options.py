"""Each setting of `ProxyConfig` as an `Option`: its flag, `PRISM_*` variable, config-file
key, help text and parser (`options()`, the table `config_sources` reads by).

Every setting has a config file key and a `PRISM_*` environment variable; the settings of
`FLAGS` also have a flag of their own, the others are `--set KEY=VALUE`; the `SECRETS`
never come from the command line. The QAS parameters (SPEC §2, §5) are generated from
`QasParams`'s fields, so a new parameter gets its key and variable for free. A new
setting is a field of `ProxyConfig` (`config.py`, with its checks) and its help text here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from prism_proxy.config import AUTOMATIC, POLICY_NAMES, ProxyConfig
from prism_proxy.qas.params import DEFAULT_QAS_VARIANT, QAS_VARIANTS, QasParams, qas_params

ENV_PREFIX = "PRISM_"
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
    "prefill_piece_tokens": "prompts with more uncached tokens than this go to the engine "
    "one at a time, those over twice this in pieces of this many tokens, so short "
    "requests wait for one piece, not for long prompts' whole prefill (auto: the "
    "engine's prefill budget per step; 0: off; docs/proxy.md)",
    "window_ms": "QAS round window Δt_win in milliseconds",
    "max_queue": "queued requests beyond which new ones get 429",
    "max_body_bytes": "largest request body accepted (413 above)",
    "max_prompt_chars": "largest prompt: characters of text (token ids count one each) over "
    "messages, prompt and hints (413 above)",
    "max_messages": "most chat messages (and content parts, tools, stop strings) in one "
    "request (413 above)",
    "max_segments": "most segments in one request's prism hint (400 above; at most 256)",
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
    "session_min_ttl_s": "shortest a paused session is kept",
    "session_default_ttl_s": "how long a paused session is kept before the return delays "
    "of its agent type are known (the return model's prior too)",
    "session_credit_half_life_s": "how long an account's returns count towards the "
    "retention it is granted (half-life)",
    "session_rank": "which paused session DART lets go first when the pool runs short: "
    "recent (the longest-paused), program (the youngest program; Continuum's order) or "
    "predicted (the one expected back last, by the return delays learned per agent type "
    "and tool)",
    "session_retain_from": "when the proxy asks DART to keep a paused session: at its "
    "answer's end, or at its tool call (as soon as the stream shows one)",
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
    "backlog_ms": "once the oldest queued request waited this long, release the longest "
    "cached prefix first, within age_cap_ms (0: off)",
    "age_cap_ms": "under a backlog, the longest a request is passed over",
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
