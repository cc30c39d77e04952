"""What the proxy does with each field of SGLang 0.5.23's request bodies.

The proxy is the engine's gateway: SGLang must never see input that the proxy could
have known would crash or wedge it. Found against a real SGLang 0.5.23 server on this
CPU (docs/reliability.md lists each finding and its test): out-of-range token ids in
any prompt, `top_k` beyond int32, `top_logprobs_num` beyond the vocabulary,
`logprob_start_len` below -1, out-of-range `stop_token_ids` with a minimum length, an
empty prompt, `positional_embed_overrides`, `token_indices_to_pool` and `custom_labels`
each kill the server; one `stop_regex` wedged its scheduler for good.

So every field of SGLang's bodies is in exactly one class, per endpoint:

* **served**: declared in the proxy's body models (`api.chat`, `api.completions`,
  `api.generate`), checked (types, SGLang's own bounds, the vocabulary, counts) and
  forwarded, or used by the token path;
* **owned by the proxy**: accepted and never forwarded (`rid` names only the client's
  response; `priority`, `kv_hints`, `log_metrics`, `received_time` are the proxy's;
  `prompt_cache_key` is a grouping hint for QAS);
* **refused**: answered 400 naming the field and why (below).

Fields SGLang does not know are dropped: its OpenAI models ignore them, so dropping
them changes nothing, and nothing unchecked is forwarded. `tests/sglang/
test_field_contract.py` holds these lists against SGLang's own request classes, so a
field a new release adds cannot slip through unclassified.
"""

from __future__ import annotations

from collections.abc import Mapping

_MULTIMODAL = "multimodal inputs are not served through PRISM (the engine would fetch URLs)"
_ROUTING = "engine-internal routing, set by a gateway, not a client"
_INTERNAL = "engine-internal"
_OUTPUTS = "engine-internal outputs, not served through PRISM"

# Refused in every body that has them, with the reason the 400 gives.
REFUSED: Mapping[str, str] = {
    "stop_regex": "Python regular expressions run on every decode step inside the engine; "
    "one pattern can wedge it (use stop strings)",
    "custom_logit_processor": "serialized code; not served through PRISM",
    "custom_params": "parameters of custom logit processors; not served through PRISM",
    "positional_embed_overrides": _INTERNAL,
    "token_indices_to_pool": _INTERNAL,
    "multi_item_delimiter_indices": _INTERNAL,
    "custom_labels": "metric labels the engine was not started with stop it",
    "input_embeds": "embeddings bypass the prompt cache PRISM schedules",
    "embed_override_token_id": "embedding overrides bypass the prompt cache PRISM schedules",
    "embed_overrides": "embedding overrides bypass the prompt cache PRISM schedules",
    "session_id": "engine sessions are not served through PRISM",
    "session_params": "engine sessions are not served through PRISM",
    "lora_path": "LoRA adapters are not served through PRISM",
    "lora_id": "LoRA adapters are not served through PRISM",
    "image_data": _MULTIMODAL,
    "video_data": _MULTIMODAL,
    "audio_data": _MULTIMODAL,
    "mm_hashes": _MULTIMODAL,
    "mm_content_hashes": _MULTIMODAL,
    "use_audio_in_video": _MULTIMODAL,
    "video_config": _MULTIMODAL,
    "images_config": _MULTIMODAL,
    "mm_processor_kwargs": _MULTIMODAL,
    "modalities": _MULTIMODAL,
    "max_dynamic_patch": _MULTIMODAL,
    "min_dynamic_patch": _MULTIMODAL,
    "image_max_dynamic_patch": _MULTIMODAL,
    "video_max_dynamic_patch": _MULTIMODAL,
    "encoder_urls": _MULTIMODAL,
    "need_wait_for_mm_inputs": _MULTIMODAL,
    "num_items_assigned": _MULTIMODAL,
    "bootstrap_host": _ROUTING,
    "bootstrap_port": _ROUTING,
    "bootstrap_room": _ROUTING,
    "bootstrap_pair_key": _ROUTING,
    "decode_tp_size": _ROUTING,
    "routed_dp_rank": _ROUTING,
    "data_parallel_rank": _ROUTING,
    "disagg_prefill_dp_rank": _ROUTING,
    "routing_key": _ROUTING,
    "conversation_id": _ROUTING,
    "http_worker_ipc": _INTERNAL,
    "external_trace_header": _INTERNAL,
    "no_logs": _INTERNAL,
    "background": _INTERNAL,
    "require_reasoning": _INTERNAL,
    "max_thinking_tokens": _INTERNAL,
    "watermark": "watermarking is not served through PRISM",
    "return_hidden_states": _OUTPUTS,
    "return_routed_experts": _OUTPUTS,
    "routed_experts_start_len": _OUTPUTS,
    "return_indexer_topk": _OUTPUTS,
    "return_sampling_mask": _OUTPUTS,
    "sampling_logprobs_mode": _OUTPUTS,
    "return_flat_raw_top_logprobs": _OUTPUTS,
    "return_flat_raw_output_top_logprobs": _OUTPUTS,
    "return_flat_raw_top_logprobs_b64": _OUTPUTS,
    "return_spec_tokens_details": _OUTPUTS,
    "return_input_ids_in_sglext": _OUTPUTS,
    "return_output_ids_in_sglext": _OUTPUTS,
    "return_bytes": _OUTPUTS,
    "return_entropy": _OUTPUTS,
    "beam_width": "beam search is not served through PRISM",
}

# Accepted from the client, never forwarded: the proxy sets or owns them.
PROXY_OWNED = frozenset(
    {"rid", "priority", "kv_hints", "log_metrics", "received_time", "prism", "prompt_cache_key"}
)

# Keys `apply_chat_template` takes itself: in `chat_template_kwargs` they collide (500).
# `messages` too: the renderer passes the conversation under that name, and SGLang 0.5.23
# answers one set here with a 500 ("Internal server error: 'messages'", whatever its value).
CHAT_TEMPLATE_RESERVED = frozenset(
    {
        "messages",
        "add_generation_prompt",
        "tokenize",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "continue_final_message",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
    }
)

# Message fields forwarded on the chat endpoint (others are dropped).
MESSAGE_FIELDS = frozenset(
    {
        "role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "tools",
        "phase", "prefix",
    }
)  # fmt: skip

# Most top logprobs per position (OpenAI's own cap), and most prompt positions times
# logprobs per position a request may ask for: SGLang keeps the memory of a large answer
# (500 positions x 8,192 took 1.3 GB that stayed after the answer).
MAX_TOP_LOGPROBS = 20
MAX_PROMPT_LOGPROB_ENTRIES = 1 << 16
# Most sequences one request may ask for (n, a batch's prompts): nothing in SGLang caps
# them, and the proxy admits a request as one.
MAX_CHOICES = 16
MAX_BATCH = 64
# Largest grammar or schema text (regex, ebnf, json_schema, structural_tag, tools'
# parameters), and its nesting.
MAX_GRAMMAR_CHARS = 65_536
MAX_SCHEMA_DEPTH = 32
# Largest free-form strings the proxy forwards (user, extra_key, cache_salt).
MAX_TAG_CHARS = 256
