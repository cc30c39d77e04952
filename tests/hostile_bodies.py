"""Request bodies that killed, wedged or 500'd a real SGLang 0.5.23 server when sent to
it directly (docs/reliability.md, "The engine's own edge"), with the field the proxy's
400 names. tests/test_input_edge.py sends them through the proxy to prism-sim, and
tests/sglang/test_live_hostile.py to a real SGLang on this CPU, whose vocabulary
(8,192) every id 99,999 is outside."""

from __future__ import annotations

CHAT_PATH, COMPLETIONS, GENERATE = "/v1/chat/completions", "/v1/completions", "/generate"
MSG = [{"role": "user", "content": "hi"}]
DEEP_SCHEMA: dict[str, object] = {"type": "string"}
for _ in range(40):
    DEEP_SCHEMA = {"type": "array", "items": DEEP_SCHEMA}
SP = {"max_new_tokens": 2}
# (path, body, the `param` of the proxy's 400), on every path: the token path and
# forwarded bodies alike.
ENGINE_KILLERS = [
    # the request that once crashed the engine, verbatim, then each variant
    (GENERATE, {"input_ids": [[1, 2, 99999]], "sampling_params": {"max_new_tokens": 2}},
     "input_ids.0.2"),
    (GENERATE, {"input_ids": [[1, 2, 3], [1, 2, 99999]]}, "input_ids.1.2"),
    (GENERATE, {"input_ids": [1, -1], "sampling_params": {"n": 2}}, "input_ids.1"),
    (COMPLETIONS, {"prompt": [1, 2, 99999], "logprobs": 1}, "prompt.2"),
    (COMPLETIONS, {"prompt": [[1], [2, 99999]], "echo": True}, "prompt.1.1"),
    (CHAT_PATH, {"messages": MSG, "input_ids": [1, 99999]}, "input_ids.1"),
    (GENERATE, {"text": ""}, "text"),
    (GENERATE, {"input_ids": [[]]}, "input_ids.0"),
    (GENERATE, {"text": ["", "a"]}, "text.0"),
    (COMPLETIONS, {"prompt": ["", "a"]}, "prompt.0"),
    (GENERATE, {"prism": {"segments": [], "suffix": ""}}, "prism"),
    (GENERATE, {"text": "a", "sampling_params": {"stop_token_ids": [99999], "min_new_tokens": 1}},
     "sampling_params.stop_token_ids.0"),
    (CHAT_PATH, {"messages": MSG, "stop_token_ids": [-3], "min_tokens": 1}, "stop_token_ids.0"),
    (CHAT_PATH, {"messages": MSG, "top_k": 2**31}, "top_k"),
    (GENERATE, {"text": "a", "sampling_params": {"top_k": 2**40}}, "sampling_params.top_k"),
    (GENERATE, {"text": "a", "return_logprob": True, "top_logprobs_num": 8193}, "top_logprobs_num"),
    (COMPLETIONS, {"prompt": "a", "logprobs": 8193}, "logprobs"),
    (CHAT_PATH, {"messages": MSG, "logprobs": True, "top_logprobs": 8193}, "top_logprobs"),
    (GENERATE, {"text": "a", "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
    (GENERATE, {"text": "a", "positional_embed_overrides": {"a": 1}}, "positional_embed_overrides"),
    (GENERATE, {"text": "a", "token_indices_to_pool": [100000]}, "token_indices_to_pool"),
    (GENERATE, {"text": "a", "custom_labels": {"a": "b"}}, "custom_labels"),
    (COMPLETIONS, {"prompt": "a", "custom_labels": {"a": "b"}}, "custom_labels"),
    (GENERATE, {"text": "a", "sampling_params": {"stop_regex": "([\\s\\S]+)+\u0001"}},
     "sampling_params.stop_regex"),
    (CHAT_PATH, {"messages": MSG, "stop_regex": "(a+)+$"}, "stop_regex"),
    (GENERATE, {"text": "a", "sampling_params": {"n": 1000}}, "sampling_params.n"),
    (CHAT_PATH, {"messages": MSG, "n": 1000}, "n"),
    (GENERATE, {"text": ["a", "b"], "sampling_params": [SP]}, "body"),
    (GENERATE, {"text": "a", "session_params": {"foo": 1}}, "session_params"),
    (CHAT_PATH, {"messages": MSG, "chat_template_kwargs": {"add_generation_prompt": "x"}},
     "chat_template_kwargs"),
    (CHAT_PATH, {"messages": MSG, "chat_template_kwargs": {"messages": []}},
     "chat_template_kwargs"),
    (CHAT_PATH, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/"}}]}]},
     "messages.0.content.0"),
    (GENERATE, {"text": "a", "image_data": "file:///etc/passwd"}, "image_data"),
    (CHAT_PATH, {"messages": MSG, "model": "base:adapter"}, "model"),
    (CHAT_PATH, {"messages": MSG, "logit_bias": {"99999": 1}}, "logit_bias.0"),
    (CHAT_PATH, {"messages": MSG, "logit_bias": {"x": 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x" * 5000, "echo": True, "logprobs": 20}, "logprobs"),
    (GENERATE, {"text": "a", "sampling_params": {"beam_width": 100000}},
     "sampling_params.beam_width"),
    (GENERATE, {"text": "a", "sampling_params": {"custom_params": {"a": 1}}},
     "sampling_params.custom_params"),
    (CHAT_PATH, {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "schema": DEEP_SCHEMA}}}, "response_format"),
]  # fmt: skip
