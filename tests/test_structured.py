"""Structured outputs admitted with care (`api.structured`, `edge.grammar_ledger`,
`edge.structured`): which grammars a body makes the engine compile, each client's share
of new ones, and both through the proxy over real HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import pytest
from proxy_support import eventually, holding_backend, loopback_app, running_proxy

from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.structured import EngineGrammar, engine_grammars
from prism_proxy.edge import grammar_ledger
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.edge.grammar_ledger import WINDOW_S, GrammarLedger

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
STRICT_TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA, "strict": True}}


# --- which grammars a body carries -------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "params"),
    [
        ({"messages": []}, []),
        ({"response_format": {"type": "text"}}, []),
        ({"response_format": {"type": "json_object"}}, []),  # one fixed grammar
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            ["response_format.json_schema.schema"],
        ),
        ({"response_format": {"type": "structural_tag", "format": {}}}, ["response_format"]),
        ({"tools": [TOOL]}, []),  # free tool calls: no grammar
        ({"tools": [TOOL], "tool_choice": "auto"}, []),
        ({"tools": [STRICT_TOOL]}, ["tools"]),
        ({"tools": [STRICT_TOOL], "tool_choice": "none"}, []),
        ({"tools": [TOOL], "tool_choice": "required"}, ["tools"]),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
         ["tools"]),
        ({"json_schema": json.dumps(SCHEMA), "regex": "a+", "ebnf": 'root ::= "a"'},
         ["json_schema", "regex", "ebnf"]),
        ({"sampling_params": {"json_schema": "{}", "structural_tag": "{}"}},
         ["sampling_params.json_schema", "sampling_params.structural_tag"]),
        ({"sampling_params": [{"regex": "a"}, {}, {"ebnf": "root ::= \"b\""}]},
         ["sampling_params.0.regex", "sampling_params.2.ebnf"]),
    ],
)  # fmt: skip
def test_the_grammars_a_body_makes_the_engine_compile(raw: dict, params: list[str]) -> None:
    assert [grammar.param for grammar in engine_grammars(raw)] == params


def test_fields_that_do_not_reach_the_engine_compile_nothing() -> None:
    raw = {"json_schema": "{}", "regex": "a"}  # a chat has no json_schema: dropped
    served = ChatCompletionRequest.model_fields
    assert [grammar.param for grammar in engine_grammars(raw, served)] == ["regex"]


def test_a_grammar_is_keyed_by_the_text_the_engine_caches() -> None:
    """A schema object is serialized in its own key order (the engine's cache matches
    its text): the same schema twice is one key, another key order is another."""

    def key(schema: object) -> bytes:
        body = {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
        return engine_grammars(body)[0].key

    assert key(SCHEMA) == key(json.loads(json.dumps(SCHEMA)))
    assert key(SCHEMA) != key(dict(reversed(SCHEMA.items())))
    assert EngineGrammar("regex", "é").size_bytes == 2  # UTF-8 bytes, not characters


# --- the ledger ------------------------------------------------------------------------------
def test_a_client_compiles_at_most_its_share_at_once_and_others_are_not_held() -> None:
    ledger = GrammarLedger(max_compiles=2, max_per_window=100)
    assert ledger.admit("a", [b"s1"], now=0.0) is None
    assert ledger.admit("a", [b"s2"], now=0.0) is None
    refusal = ledger.admit("a", [b"s3"], now=0.0)
    assert refusal is not None and "max_client_grammar_compiles" in refusal.message
    assert ledger.admit("b", [b"s3"], now=0.0) is None  # another client's own share
    ledger.finish("a", [b"s1"], compiled=True, now=1.0)
    assert ledger.new([b"s1", b"s2", b"s3"]) == [b"s2", b"s3"]  # s1 is cheap now
    assert ledger.admit("a", [b"s3"], now=1.0) is None
    ledger.finish("a", [b"s2"], compiled=False, now=1.0)  # never answered: still new
    assert ledger.new([b"s2"]) == [b"s2"]
    assert ledger.compiling("a") == 1 and ledger.compiling("b") == 1


def test_a_client_introduces_at_most_its_share_of_new_grammars_per_window() -> None:
    ledger = GrammarLedger(max_compiles=10, max_per_window=3)
    for i, now in enumerate((0.0, 10.0, 20.0)):
        assert ledger.admit("a", [b"%d" % i], now) is None
        ledger.finish("a", [b"%d" % i], compiled=True, now=now)
    refusal = ledger.admit("a", [b"x"], now=30.0)
    assert refusal is not None and "max_client_grammars_per_minute" in refusal.message
    # the first introduction leaves the window at 0 + 60 s: 30 s to wait
    assert refusal.retry_after_s == pytest.approx(WINDOW_S - 30.0)
    assert ledger.admit("b", [b"x"], now=30.0) is None
    assert ledger.admit("a", [b"x"], now=WINDOW_S + 0.5) is None


def test_the_ledger_is_bounded_and_forgets_clients_once_their_minute_passed(
    monkeypatch,
) -> None:
    monkeypatch.setattr(grammar_ledger, "MAX_CLIENTS", 10)
    ledger = GrammarLedger(max_compiles=1, max_per_window=1)
    for i in range(10):
        client = f"10.0.0.{i}"
        assert ledger.admit(client, [b"k%d" % i], now=float(i)) is None
        ledger.finish(client, [b"k%d" % i], compiled=True, now=float(i))
    assert len(ledger) == 10  # each introduced one within the window
    refusal = ledger.admit("late", [b"z"], now=20.0)
    assert refusal is not None and "too many clients" in refusal.message
    assert len(ledger) == 10
    # once their introductions left the window, the table sweeps them for a newcomer
    assert ledger.admit("late", [b"z"], now=WINDOW_S + 10.0) is None
    assert len(ledger) == 1
    ledger.finish("late", [b"z"], compiled=False, now=2 * WINDOW_S + 10.0)
    assert len(ledger) == 0  # nothing in flight, nothing within the window


# --- through the proxy ------------------------------------------------------------------------
async def post(url: str, body: dict, address: str) -> tuple[int, dict, dict]:
    connector = aiohttp.TCPConnector(local_addr=(address, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(url + "/generate", json=body) as response,
    ):
        answer = await response.json() if response.status != 200 else {}
        return response.status, answer, dict(response.headers)


def structured(schema: dict, max_new_tokens: int = 1) -> dict:
    return {"text": "Answer:", "sampling_params": {"json_schema": json.dumps(schema),
                                                   "max_new_tokens": max_new_tokens}}  # fmt: skip


def schema_named(name: str) -> dict:
    return {"type": "object", "properties": {name: {"type": "string"}}}


def recording(
    seen: list[dict], arrived: list[tuple[str, bool]], release: asyncio.Event
) -> Callable[[dict], None]:
    """`holding_backend`'s `record`: each body, and its schema with whether it arrived
    after `release` was set."""

    def record(body: dict) -> None:
        seen.append(body)
        arrived.append((body["sampling_params"]["json_schema"], release.is_set()))

    return record


async def test_new_grammars_of_one_client_are_bounded_and_another_client_is_served() -> None:
    """A backend that holds every answer until told: client A's request with a new
    schema is in flight (compiling, as far as the proxy can tell), so A's next new one
    gets 429; client B's new one passes; once answered, A's schema is cheap."""
    release = asyncio.Event()
    seen: list[dict] = []
    arrived: list[tuple[str, bool]] = []
    backend = holding_backend(release, recording(seen, arrived, release))
    a, b = "127.0.0.2", "127.0.0.3"
    async with (
        loopback_app(backend) as url,
        running_proxy(
            url, tokenizer="builtin", max_client_grammar_compiles=1,
            max_client_grammars_per_minute=3, max_schema_bytes=2_000, retry_after_s=2,
        ) as proxy,
    ):  # fmt: skip
        ledger = proxy.app[GATEWAY].structured
        first = asyncio.create_task(post(proxy.url, structured(schema_named("s1")), a))
        await eventually(lambda: ledger.compiling(a) == 1)
        async with asyncio.timeout(30):  # a liveness bound: without the share it would wait
            status, answer, headers = await post(proxy.url, structured(schema_named("s2")), a)
        assert status == 429 and answer["error"]["type"] == "rate_limit_exceeded"
        assert "max_client_grammar_compiles" in answer["error"]["message"]
        assert headers["Retry-After"] == "2"
        other = asyncio.create_task(post(proxy.url, structured(schema_named("s3")), b))
        await eventually(lambda: ledger.compiling(b) == 1)
        # s1 again, from B (whose one slot is taken): it waits for A's s1 to be answered,
        # then goes as a compiled grammar, without a slot (the engine compiles s1 once)
        same = asyncio.create_task(post(proxy.url, structured(schema_named("s1")), b))
        release.set()
        assert (await first)[0] == (await other)[0] == (await same)[0] == 200
        s1 = json.dumps(schema_named("s1"))
        assert [after for text, after in arrived if text == s1] == [False, True]
        await eventually(lambda: ledger.compiling(a) == ledger.compiling(b) == 0)
        # s1 was answered: compiled, cheap for anyone, whatever the shares
        await eventually(lambda: ledger.compiling(b) == 0)
        sent = len(seen)
        for _ in range(3):
            assert (await post(proxy.url, structured(schema_named("s1")), a))[0] == 200
        assert len(seen) == sent + 3
        # A introduced s1; two more new ones fit its minute, the third does not
        for name in ("s4", "s5"):
            assert (await post(proxy.url, structured(schema_named(name)), a))[0] == 200
        status, answer, headers = await post(proxy.url, structured(schema_named("s6")), a)
        assert status == 429 and "max_client_grammars_per_minute" in answer["error"]["message"]
        assert int(headers["Retry-After"]) > 2  # until its oldest leaves the minute
        # too large: 400 naming the schema and the setting, whoever sends it
        big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(99)}}
        status, answer, _ = await post(proxy.url, structured(big), b)
        assert status == 400 and answer["error"]["param"] == "sampling_params.json_schema"
        assert "max_schema_bytes" in answer["error"]["message"]
        assert len(seen) == sent + 5  # none of the refused reached the engine
        # both 429s counted per account (without keys, every client is `addr`)
        refused = {"account": "addr", "status": "429", "limit": "grammars"}
        registry = proxy.app[GATEWAY].metrics.registry
        assert registry.get_sample_value("prism:account_requests_total", refused) == 2


async def test_a_fleet_with_the_same_new_schema_compiles_it_once_and_none_is_refused() -> None:
    """20 requests at once from one client with one new schema (agents starting with
    the same tools): the first goes to the engine; the others wait in the proxy for its
    answer, then go as compiled. None gets 429, though the client's share is one."""
    release = asyncio.Event()
    seen: list[dict] = []
    arrived: list[tuple[str, bool]] = []
    backend = holding_backend(release, recording(seen, arrived, release))
    async with (
        loopback_app(backend) as url,
        running_proxy(url, tokenizer="builtin", max_client_grammar_compiles=1) as proxy,
    ):
        ledger = proxy.app[GATEWAY].structured
        body = structured(schema_named("tools"))
        fleet = [asyncio.create_task(post(proxy.url, body, "127.0.0.2")) for _ in range(20)]
        await eventually(lambda: len(seen) == 1 and ledger.compiling("127.0.0.2") == 1)
        release.set()
        statuses = [status for status, _, _ in await asyncio.gather(*fleet)]
        assert statuses == [200] * 20
        # only the first reached the engine before its answer; the others after it
        assert [after for _, after in arrived] == [False] + [True] * 19
        await eventually(lambda: not proxy.app[GATEWAY].compiled and len(ledger) <= 1)
