"""Property-based HTTP fuzz of every endpoint: the proxy, prism-sim and the
DART control RPC, as real subprocesses on loopback. Whatever the body — random bytes,
any JSON value (lone surrogates and deep nesting included), or a valid request with one
field replaced by anything — every request gets exactly one complete response, and
none is a 5xx. Afterwards nothing is left queued or in flight."""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxy_support import DartStack, dart_stack, proxy_idle, wait_until

TOKEN = secrets.token_hex(8)
EXAMPLES = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[DartStack]:
    quiet = ["--log-level", "warning"]
    with dart_stack(
        tmp_path_factory.mktemp("fuzz"), TOKEN, quiet, ["--speed", "200", *quiet]
    ) as servers:
        yield servers


# --- what goes in ---------------------------------------------------------------------
SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | SURROGATES
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
DEEP = st.integers(min_value=1, max_value=200_000).map(lambda depth: b"[" * depth)
BODIES = st.binary(max_size=120) | JSON_VALUES.map(lambda v: encode(v)) | DEEP
# Values a valid request may carry without asking for a long generation.
SMALL = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=12)
    | st.floats(min_value=-3, max_value=3)
    | st.text(max_size=12)
    | SURROGATES
    | st.lists(st.integers(min_value=-2, max_value=9000), max_size=4)
    | st.dictionaries(st.text(max_size=6), st.integers(0, 3) | st.text(max_size=6), max_size=3)
)

VALID = {
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 3},
    "/v1/completions": {"model": "m", "prompt": "hi", "max_tokens": 3},
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 3}},
}  # fmt: skip
FIELDS = {
    "/v1/chat/completions": [
        "messages", "stream", "max_tokens", "temperature", "top_p", "top_k", "n", "stop",
        "prism", "tools", "logprobs", "stream_options", "seed", "min_tokens", "rid",
    ],
    "/v1/completions": ["prompt", "stream", "max_tokens", "echo", "suffix", "prism", "n"],
    "/generate": ["text", "input_ids", "sampling_params", "stream", "rid", "prism", "kv_hints"],
}  # fmt: skip
MUTATED = st.sampled_from(sorted(VALID)).flatmap(
    lambda path: st.builds(
        lambda field, value, stream: (path, {**VALID[path], field: value, "stream": stream}),
        st.sampled_from(FIELDS[path]),
        SMALL,
        st.booleans(),
    )
)
# A segment hint where the value goes: the prism object's own fields.
HINTS = st.builds(
    lambda segments, system, reorder: (
        "/v1/chat/completions",
        {**VALID["/v1/chat/completions"], "prism": {"segments": segments, "system": system,
                                                     "reorder": reorder}},
    ),
    st.lists(st.fixed_dictionaries({"id": SMALL, "text": SMALL}), max_size=3),
    SMALL,
    SMALL,
)  # fmt: skip


def encode(body: Any) -> bytes:
    """JSON text; lone surrogates go out as `\\udXXX` escapes (what a client sends)."""
    return json.dumps(body).encode()


STATUSES: Counter[int] = Counter()  # every status this module saw (the report's table)


def send(method: str, url: str, data: bytes | None, headers: dict | None = None) -> int:
    """One request; the whole answer is read (a stream to its end). Returns the status."""
    with httpx.Client(timeout=60.0) as client:
        response = client.request(method, url, content=data, headers=headers)
        response.read()
    STATUSES[response.status_code] += 1
    return response.status_code


def assert_answered(status: int, what: object) -> None:
    assert 200 <= status < 500, (status, what)


# --- the proxy ------------------------------------------------------------------------
@EXAMPLES
@given(path=st.sampled_from(sorted(VALID)), data=BODIES)
def test_proxy_survives_any_body(stack, path: str, data: bytes) -> None:
    proxy, _, _ = stack
    assert_answered(send("POST", proxy.url + path, data), data)


@EXAMPLES
@given(case=MUTATED | HINTS)
def test_proxy_survives_any_field_value(stack, case: tuple[str, dict]) -> None:
    proxy, _, _ = stack
    path, body = case
    assert_answered(send("POST", proxy.url + path, encode(body)), body)


# --- prism-sim ------------------------------------------------------------------------
SIM_POSTS = ["/generate", "/v1/chat/completions", "/v1/completions", "/abort_request"]


@EXAMPLES
@given(path=st.sampled_from(SIM_POSTS), data=BODIES)
def test_prism_sim_survives_any_body(stack, path: str, data: bytes) -> None:
    _, sim, _ = stack
    assert_answered(send("POST", sim.url + path, data), data)


@EXAMPLES
@given(case=MUTATED)
def test_prism_sim_survives_any_field_value(stack, case: tuple[str, dict]) -> None:
    _, sim, _ = stack
    path, body = case
    body = {k: v for k, v in body.items() if k != "prism"}
    assert_answered(send("POST", sim.url + path, encode(body)), body)


# --- the control RPC ------------------------------------------------------------------
UPDATES = st.fixed_dictionaries(
    {"epoch": SMALL | st.integers(min_value=0, max_value=10**30), "table": SMALL | JSON_VALUES},
    optional={"protect": SMALL},
).map(encode)


@EXAMPLES
@given(
    path=st.sampled_from(["/prism/priorities", "/prism/reset"]),
    data=BODIES | UPDATES,
)
def test_control_rpc_survives_any_body(stack, path: str, data: bytes) -> None:
    _, _, control = stack
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert_answered(send("POST", control + path, data, headers), data)


def test_every_get_endpoint_answers_and_nothing_is_left_over(stack) -> None:
    """Runs last in the module: after all of the above, every GET answers and the
    proxy holds nothing."""
    proxy, sim, control = stack
    for url in (proxy.url, sim.url):
        for path in ("/health", "/metrics", "/v1/models"):
            assert send("GET", url + path, None) == 200
    for path in ("/server_info", "/get_server_info", "/model_info", "/health_generate"):
        assert send("GET", sim.url + path, None) == 200
    for path in ("/prism/stats", "/prism/metrics", "/prism/health"):
        assert send("GET", control + path, None, {"Authorization": f"Bearer {TOKEN}"}) == 200
    wait_until(lambda: proxy_idle(proxy.url))
    # The fuzz reached both sides of validation: answers and refusals.
    assert STATUSES[200] > 0 and sum(n for s, n in STATUSES.items() if 400 <= s < 500) > 0
    print(f"\nfuzz: {sum(STATUSES.values())} requests, statuses {dict(sorted(STATUSES.items()))}")
