"""What the proxy publishes of the engine's info answers: an allow-list per endpoint.

SGLang 0.5.23's `/server_info` is every launch argument, resolved, at the top level and
again in each `internal_states` entry: its API keys, its host and port, the model,
tokenizer and download paths, the launch command. Its `/model_info` and `/v1/models`
name the model by its path. A client of the proxy must read none of it: a leaked admin
key unlocks SGLang's `/flush_cache` and weight updates, and an address or path tells an
attacker where to go next.

So nothing passes by default. Each endpoint has a spec, a tree of the fields a gateway
needs (sgl-model-gateway's worker discovery and load monitor, SGLang clients picking a
model) whose values cannot name a secret, an address or a path; each field has a rule
that checks its value's shape and drops it when the shape is wrong:

* `number`, `flag`: JSON numbers (or null), booleans (or null);
* `word`: a short identifier (`round_robin`, `0.5.23`, `Qwen2ForCausalLM`): no `/`, `:`,
  `@` or space, so no path, URL, address or key-with-separators fits;
* `model_name`: a served model name; a path-like one (SGLang's default served name is
  the model path) is published as its last component, the name smg itself derives
  from a model path;
* `fields(spec)` and `each(rule)` for nested objects and lists.

A field the engine adds in a new release is dropped until it is listed here. The proxy
reads the engine's own answers unfiltered for its pacing (`BackendLimits`) and
tokenizer; the allow-list applies only to what it answers its clients.
`tests/sglang/test_live_info.py` holds these specs against a real SGLang's output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Rule = Callable[[Any], Any]


class _Drop:
    """The value a rule returns for a field that must not be published."""


DROP: Any = _Drop()
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
_NAME_LIMIT = 256


def number(value: Any) -> Any:
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    return DROP


def flag(value: Any) -> Any:
    return value if value is None or isinstance(value, bool) else DROP


def word(value: Any) -> Any:
    if value is None or (isinstance(value, str) and _WORD.fullmatch(value)):
        return value
    return DROP


def model_name(value: Any) -> Any:
    """A served model name, reduced to its last path component when it is path-like
    (`/models/Qwen3-4B` → `Qwen3-4B`; `Qwen/Qwen3-4B` → `Qwen3-4B`)."""
    if value is None:
        return None
    if not isinstance(value, str):
        return DROP
    parts = [part for part in re.split(r"[/\\]", value) if part]
    name = parts[-1] if parts else ""
    if not name or len(name) > _NAME_LIMIT or name in (".", "..", "~"):
        return DROP
    return name


def fields(spec: Mapping[str, Rule]) -> Rule:
    """An object: only the fields of `spec`, each passed through its rule."""

    def rule(value: Any) -> Any:
        return published(value, spec) if isinstance(value, Mapping) else DROP

    return rule


def each(item: Rule) -> Rule:
    """A list: every item passed through `item`; items it drops are left out."""

    def rule(value: Any) -> Any:
        if not isinstance(value, list):
            return DROP
        return [out for out in map(item, value) if out is not DROP]

    return rule


def published(value: Mapping[str, Any], spec: Mapping[str, Rule]) -> dict[str, Any]:
    """The fields of `value` that `spec` lists and whose values its rules accept."""
    out: dict[str, Any] = {}
    for key, rule in spec.items():
        if key in value:
            kept = rule(value[key])
            if kept is not DROP:
                out[key] = kept
    return out


# What sgl-model-gateway (smg) reads at worker registration: its `ServerInfo` and
# `ModelInfo` (model_gateway/src/workflow/steps/local/discover_metadata.rs) minus the
# paths, and the batch limits a proxy in front of this one paces by
# (`BackendLimits.from_server_info`); the rest describes how the engine serves.
SERVER_INFO: dict[str, Rule] = {
    "version": word,
    "status": word,
    "served_model_name": model_name,
    "model_id": model_name,
    "model": model_name,
    "weight_version": word,
    "is_embedding": flag,
    "tp_size": number,
    "dp_size": number,
    "pp_size": number,
    "ep_size": number,
    "load_balance_method": word,
    "disaggregation_mode": word,
    "context_length": number,
    "max_req_input_len": number,
    "max_total_tokens": number,
    "max_total_num_tokens": number,
    "max_running_requests": number,
    "max_queued_requests": number,
    "max_prefill_tokens": number,
    "chunked_prefill_size": number,
    "page_size": number,
    "schedule_policy": word,
    "radix_eviction_policy": word,
    "enable_cache_report": flag,
    "incremental_streaming_output": flag,
    "tool_call_parser": word,
    "reasoning_parser": word,
    "internal_states": each(
        fields(
            {
                "effective_max_running_requests_per_dp": number,
                "last_gen_throughput": number,
                "num_running_reqs": number,
                "num_queue_reqs": number,
            }
        )
    ),
}

MODEL_INFO: dict[str, Rule] = {
    "served_model_name": model_name,
    "is_generation": flag,
    "weight_version": word,
    "model_type": word,
    "architectures": each(word),
    "has_image_understanding": flag,
    "has_audio_understanding": flag,
    "tool_call_parser": word,
    "reasoning_parser": word,
    "disaggregation_mode": word,
}

# OpenAI's model card plus SGLang's `max_model_len` and `parent` (a LoRA adapter's base);
# SGLang's `root` is the served name or a LoRA adapter's path, so it is left out.
MODELS: dict[str, Rule] = {
    "object": word,
    "data": each(
        fields(
            {
                "id": model_name,
                "object": word,
                "created": number,
                "owned_by": word,
                "parent": model_name,
                "max_model_len": number,
            }
        )
    ),
}

# SGLang 0.5.23's `LoadSnapshot` (managers/load_snapshot.py): every field is a load
# figure; `accelerator` is the accelerator's product name (`NVIDIA H100 80GB HBM3`).
_LOAD_NUMBERS = (
    "timestamp", "dp_rank", "num_running_reqs", "num_waiting_reqs",
    "num_waiting_uncached_tokens", "num_used_tokens", "num_total_tokens",
    "num_active_tokens", "num_prealloc_ready_tokens", "max_total_num_tokens",
    "max_running_requests", "token_usage", "gen_throughput", "cache_hit_rate",
    "utilization", "total_prefill_uncached_tokens", "total_prefill_busy_us",
)  # fmt: skip
_DISAGGREGATION_NUMBERS = (
    "prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs",
    "decode_prealloc_queue_reqs", "decode_transfer_queue_reqs",
    "decode_retracted_queue_reqs", "kv_transfer_speed_gb_s", "kv_transfer_latency_ms",
)  # fmt: skip
_QUEUE_NUMBERS = ("waiting", "grammar", "paused", "retracted", "prealloc_ready")
_MEMORY_NUMBERS = ("weight_gb", "kv_cache_gb", "graph_gb", "token_capacity")


def _numbers(names: tuple[str, ...]) -> dict[str, Rule]:
    return dict.fromkeys(names, number)


_LOAD: dict[str, Rule] = {
    **_numbers(_LOAD_NUMBERS),
    "decode_moments": each(number),
    "memory": fields(_numbers(_MEMORY_NUMBERS)),
    "speculative": fields(_numbers(("accept_length", "accept_rate"))),
    "lora": fields(_numbers(("slots_used", "slots_total", "utilization"))),
    "disaggregation": fields({"mode": word, **_numbers(_DISAGGREGATION_NUMBERS)}),
    "queues": fields(_numbers(_QUEUE_NUMBERS)),
}
_ACCELERATOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.+()-]{0,127}")
_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?")


def _accelerator(value: Any) -> Any:
    if value is None or (isinstance(value, str) and _ACCELERATOR.fullmatch(value)):
        return value
    return DROP


def _iso_time(value: Any) -> Any:
    return value if isinstance(value, str) and _ISO_TIME.fullmatch(value) else DROP


LOADS: dict[str, Rule] = {
    "timestamp": _iso_time,
    "version": word,
    "accelerator": _accelerator,
    "num_accelerators": number,
    "loads": each(fields(_LOAD)),
}

# The query parameters of SGLang's `GET /v1/loads` that are forwarded (`format=
# prometheus` would answer text, which the proxy does not relay).
LOADS_QUERY = ("include", "dp_rank")
