"""Hostile input through the proxy to a real, unmodified SGLang 0.5.23 on this CPU.
Sent to SGLang directly, each body of `hostile_bodies.ENGINE_KILLERS`
killed the server (or wedged or 500'd it); through the proxy each is a 400 naming the
field, and the engine serves the next request. Then a bounded fuzz campaign: valid
requests of every endpoint with fields (SGLang's own field names, the proxy's, unknown
ones) set to hostile values, and raw bodies; every answer is a 4xx with an
OpenAI-style JSON error or a normal answer, and the engine is alive and serving after
every one of them.

The proxy runs as `prism-proxy serve` (a subprocess) with the served model's tokenizer
directory, in front of the `hostile` server of `live_support` (DART, incremental
streams, SGLang's `--api-key` and `--admin-api-key`, as deployed); the proxy gets the
engine's key and the control token from its environment."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hostile_bodies import CHAT_PATH, COMPLETIONS, ENGINE_KILLERS, GENERATE, MSG
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_support import LiveServer
from proxy_support import proxy_idle, wait_until

from loadgen.stack.processes import ServerProcess, run_server
from prism_tokens.tokenizer import load_tokenizer
from sglang_cpu.model import ensure_tiny_model

pytestmark = pytest.mark.sglang

V = load_tokenizer(str(ensure_tiny_model())).vocab_size  # the served vocabulary (8192)


@pytest.fixture(scope="module")
def stack(live, tmp_path_factory) -> Iterator[tuple[LiveServer, ServerProcess]]:
    server: LiveServer = live["hostile"]
    args = [
        "serve", "--backend", server.url, "--tokenizer", str(ensure_tiny_model()),
        "--control-url", server.control_url,
        "--set", "health_interval_s=0", "--log-level", "warning",
    ]  # fmt: skip
    env = {"PRISM_CONTROL_TOKEN": server.token, "PRISM_ENGINE_API_KEY": server.api_key or ""}
    logs = tmp_path_factory.mktemp("hostile-proxy")
    with run_server("prism_proxy", args, log_dir=logs, name="proxy", env=env) as proxy:
        yield server, proxy


def engine_serves(server: LiveServer) -> None:
    """The engine's processes are up and it answers a one-token generation."""
    assert server.server.process.poll() is None, server.server.log_text()[-3000:]
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1}}
    answer = httpx.post(server.url + "/generate", json=body, headers=server.headers, timeout=120.0)
    assert answer.status_code == 200, answer.text


def is_json_error(response: httpx.Response) -> bool:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str)


AT_THE_EDGE = [
    (GENERATE, {"input_ids": [1, 2, V], "sampling_params": {"max_new_tokens": 2}}, "input_ids.2"),
    (GENERATE, {"input_ids": [1, 2, 2**31]}, "input_ids.2"),
    (CHAT_PATH, {"messages": MSG, "top_k": V + 1}, "top_k"),
    (GENERATE, {"text": "a", "return_logprob": True, "top_logprobs_num": V + 1},
     "top_logprobs_num"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param"), ENGINE_KILLERS + AT_THE_EDGE)
def test_each_engine_killer_is_a_4xx_and_the_engine_serves_the_next_request(
    stack, path: str, body: dict[str, Any], param: str
) -> None:
    server, proxy = stack
    response = httpx.post(proxy.url + path, json=body, timeout=120.0)
    assert response.status_code == 400, response.text
    assert is_json_error(response) and response.json()["error"]["param"] == param
    engine_serves(server)


def test_the_same_requests_within_bounds_are_served(stack) -> None:
    """The checks refuse what is outside, not the feature: ids up to V - 1, top_k = V,
    20 top logprobs, stop ids with a minimum length, a batch and n = 2 all answer."""
    server, proxy = stack
    sp = {"max_new_tokens": 2}
    for path, body in [
        (GENERATE, {"input_ids": [[1, 2, V - 1], [4, 5]], "sampling_params": sp}),
        (GENERATE, {"input_ids": [1, 2], "sampling_params": {**sp, "n": 2, "top_k": V}}),
        (GENERATE, {"text": "a b", "return_logprob": True, "top_logprobs_num": 20,
                    "sampling_params": {**sp, "stop_token_ids": [V - 1], "min_new_tokens": 1}}),
        (COMPLETIONS, {"prompt": [1, 2, V - 1], "logprobs": 5, "max_tokens": 2}),
        (CHAT_PATH, {"messages": MSG, "max_tokens": 2, "logprobs": True, "top_logprobs": 20}),
    ]:  # fmt: skip
        response = httpx.post(proxy.url + path, json=body, timeout=120.0)
        assert response.status_code == 200, (path, body, response.text)
    engine_serves(server)


# Grammars SGLang's xgrammar cannot compile, and the field the proxy's 400 names.
UNCOMPILABLE = [
    (CHAT_PATH, {"messages": MSG, "max_tokens": 3, "ebnf": "root ::= ("}, "ebnf"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 3, "ebnf": 'rule ::= "a"'}, "ebnf"),
    (CHAT_PATH, {"messages": MSG, "max_tokens": 3, "regex": "(("}, "regex"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 3, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param"), UNCOMPILABLE)
async def test_a_grammar_the_engine_cannot_compile_is_a_400_naming_it(
    live, live_proxy_factory, path: str, body: dict[str, Any], param: str
) -> None:
    """With `grammars = on` the proxy sends grammars unchecked and SGLang compiles them;
    one it cannot compile is the client's 400 naming the field (never a 5xx), and the
    engine serves the next request."""
    server: LiveServer = live["hostile"]
    proxy = await live_proxy_factory(server, grammars="on")
    async with httpx.AsyncClient(timeout=120.0) as client:
        response = await client.post(proxy.url + path, json={"model": "m", **body})
    assert response.status_code == 400, response.text
    assert is_json_error(response) and response.json()["error"]["param"] == param
    assert "Failed to compile" in response.json()["error"]["message"]
    engine_serves(server)


# --- the fuzz campaign ------------------------------------------------------------------
# Values at every edge the engine has shown, and ordinary ones; none asks for a long
# generation (the bodies keep max_tokens small).
INTS = [-(2**63) - 1, -(2**63), -(2**31), -2, -1, 0, 1, 2, 20, 21, V - 1, V, V + 1,
        2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 10**30]  # fmt: skip
FLOATS = [-1e308, -1.5, 0.5, 1e308]
STRINGS = ["", "a", "(a+)+$", "([\\s\\S]+)+\u0001", "(", "file:///etc/passwd",
           "http://127.0.0.1:9/x", "data:,x", "base:adapter", "\x00sys", "x" * 300]  # fmt: skip
LISTS = [[], [-1], [V], [0, V - 1], [[]], [""], [[1, V]], [[1, 2], [3]], ["a", "b"], [{}]]
DICTS = [{}, {"a": 1}, {"add_generation_prompt": True}, {"reconstruct": 1}, {str(V): 1.0},
         {"-1": 1.0}, {"type": "json_schema", "json_schema": {"schema": {"type": "string"}}},
         {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x"}}]  # fmt: skip
ANY = [None, True, False, *INTS, *FLOATS, *STRINGS, *LISTS, *DICTS]
# Per field, the values that have hurt the engine there.
ID_LISTS = [[-1], [V], [1, V - 1, V], [2**31], [-(2**63)], [[1, V]], [[]], [[1, 2], [3, -5]], []]
BIAS = [{str(V): 1.0}, {"-1": 1.0}, {"1": 1e308}, {"x": 1.0}, {"5": -100.0}]
FIELD_VALUES: dict[str, list[Any]] = {
    **dict.fromkeys(["input_ids", "prompt", "stop_token_ids", "token_ids_logprob"], ID_LISTS),
    **dict.fromkeys(
        ["top_k", "top_logprobs", "top_logprobs_num", "logprobs", "logprob_start_len", "n",
         "best_of", "min_tokens", "min_new_tokens", "stream_interval", "beam_width"],
        INTS,
    ),
    "logit_bias": BIAS,
    "stop_regex": STRINGS,
    "text": STRINGS + LISTS,
}  # fmt: skip
# The fields each body is fuzzed in: SGLang 0.5.23's names of it (test_field_contract.py
# holds the proxy's lists against its classes), some the proxy owns, an unknown one.
COMMON = [
    "stream", "top_k", "top_p", "temperature", "min_p", "n", "stop", "stop_token_ids",
    "stop_regex", "logit_bias", "seed", "min_tokens", "rid", "priority", "extra_key",
    "cache_salt", "custom_logit_processor", "custom_params", "session_params", "lora_path",
    "return_hidden_states", "regex", "ebnf", "response_format", "prism", "unknown_field",
]  # fmt: skip
FIELDS = {
    CHAT_PATH: [*COMMON, "messages", "input_ids", "logprobs", "top_logprobs", "tools",
                "tool_choice", "chat_template_kwargs", "continue_final_message",
                "reasoning_effort", "max_completion_tokens", "model"],
    COMPLETIONS: [*COMMON, "prompt", "echo", "logprobs", "suffix", "best_of",
                  "custom_labels", "json_schema", "model"],
    GENERATE: ["text", "input_ids", "return_logprob", "logprob_start_len",
               "top_logprobs_num", "token_ids_logprob", "positional_embed_overrides",
               "token_indices_to_pool", "custom_labels", "image_data", "input_embeds",
               "kv_hints", "log_metrics", "rid", "priority", "stream", "prism",
               "multi_item_delimiter_indices", "unknown_field"],
}  # fmt: skip
SAMPLING = [
    "top_k", "top_p", "temperature", "min_p", "n", "stop", "stop_token_ids", "stop_regex",
    "min_new_tokens", "logit_bias", "beam_width", "custom_params", "json_schema",
    "regex", "structural_tag", "stream_interval", "sampling_seed", "unknown_field",
]  # fmt: skip
# What makes a field's value matter: logprobs asked for, a minimum length, one prompt.
COMPANIONS = {
    "top_logprobs_num": {"return_logprob": True},
    "logprob_start_len": {"return_logprob": True},
    "token_ids_logprob": {"return_logprob": True},
    "top_logprobs": {"logprobs": True},
    "stop_token_ids": {"min_tokens": 1},
}

VALID = {
    CHAT_PATH: {"model": "m", "messages": MSG, "max_tokens": 3},
    COMPLETIONS: {"model": "m", "prompt": "hi", "max_tokens": 3},
    GENERATE: {"text": "hi", "sampling_params": {"max_new_tokens": 3}},
}


def mutated(path: str, fields: list[tuple[str, Any]], nested: bool) -> tuple[str, dict]:
    """A valid body of `path` with `fields` set (in its `sampling_params` if `nested`)."""
    body = json.loads(json.dumps(VALID[path]))
    target = body["sampling_params"] if nested else body
    for name, value in fields:
        for companion, setting in COMPANIONS.get(name, {}).items():
            if nested and companion == "min_tokens":
                target["min_new_tokens"] = 1
            elif not nested:
                target.setdefault(companion, setting)
        target[name] = value
    if path == GENERATE and "input_ids" in body:
        body.pop("text", None)  # one prompt or the other
    return path, body


def edge_cases() -> Iterator[tuple[str, dict]]:
    """Every fuzzed field of every body set to each value that has hurt the engine
    there, then to each of a handful of any-field values."""
    generic = [None, True, "", -1, 0, 2**31, 2**63, 1e308, [], {}, [-1], [V], "(a+)+$"]
    for path in sorted(VALID):
        places = [(False, FIELDS[path])] + ([(True, SAMPLING)] if path == GENERATE else [])
        for nested, names in places:
            for name in names:
                for value in [*FIELD_VALUES.get(name, []), *generic]:
                    yield mutated(path, [(name, value)], nested)


def send(proxy: ServerProcess, path: str, body: object) -> httpx.Response:
    with httpx.Client(timeout=120.0) as client:
        response = client.post(proxy.url + path, content=json.dumps(body).encode())
        response.read()
    return response


STATUSES: Counter[int] = Counter()
CAMPAIGN = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same campaign on every run: bounded and reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def answered(response: httpx.Response, what: object) -> None:
    """A normal answer, or a 4xx with an OpenAI-style JSON error; never a 5xx."""
    STATUSES[response.status_code] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500], what)
    if response.status_code >= 400:
        assert is_json_error(response), (response.text[:500], what)


def test_fuzz_every_field_at_every_edge(stack) -> None:
    """The deterministic half of the campaign: one field at a time, every edge value
    (about 1,300 requests), the engine checked after each."""
    server, proxy = stack
    cases = list(edge_cases())
    for path, body in cases:
        answered(send(proxy, path, body), (path, body))
        engine_serves(server)
    assert len(cases) > 1000


VALUE = st.sampled_from(ANY)


def field_value(names: list[str]) -> st.SearchStrategy[tuple[str, Any]]:
    return st.sampled_from(names).flatmap(
        lambda name: st.tuples(
            st.just(name),
            st.sampled_from(FIELD_VALUES[name]) | VALUE if name in FIELD_VALUES else VALUE,
        )
    )


MUTATED = st.sampled_from(sorted(VALID)).flatmap(
    lambda path: st.builds(
        mutated,
        st.just(path),
        st.lists(field_value(FIELDS[path]), min_size=2, max_size=4),
        st.just(False),
    )
) | st.builds(
    mutated,
    st.just(GENERATE),
    st.lists(field_value(SAMPLING), min_size=2, max_size=4),
    st.just(True),
)
RAW = st.sampled_from(sorted(VALID)).flatmap(
    lambda path: st.tuples(
        st.just(path),
        st.binary(max_size=64)
        | st.sampled_from([b"", b"[]", b"null", b"{", b'{"text":"\\ud800"}', b"[" * 5000]),
    )
)


@CAMPAIGN
@given(case=MUTATED)
def test_fuzz_hostile_field_combinations(stack, case: tuple[str, dict]) -> None:
    """The random half: two to four fields at once, hostile values drawn."""
    server, proxy = stack
    path, body = case
    answered(send(proxy, path, body), body)
    engine_serves(server)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(case=RAW)
def test_fuzz_raw_bodies(stack, case: tuple[str, bytes]) -> None:
    server, proxy = stack
    path, data = case
    headers = {"Content-Type": "application/json"}
    response = httpx.post(proxy.url + path, content=data, headers=headers, timeout=120.0)
    answered(response, data)
    engine_serves(server)


def test_after_the_campaign_the_engine_and_the_proxy_are_clean(stack) -> None:
    """Runs last: the engine serves, the proxy holds nothing, and the campaign reached
    both sides of the checks (answers and refusals)."""
    server, proxy = stack
    engine_serves(server)
    wait_until(lambda: proxy_idle(proxy.url))
    assert STATUSES[200] > 0 and sum(n for s, n in STATUSES.items() if 400 <= s < 500) > 0
    print(f"\nlive fuzz: {sum(STATUSES.values())} requests, {dict(sorted(STATUSES.items()))}")
