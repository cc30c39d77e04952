"""The proxy's tokenizer against the engine's (docs/proxy.md, "The tokenizer").

Pure: `prism_tokens.verify.compare` over two tokenizations, the check's staleness.
prism-sim's `/v1/tokenize` and `/v1/detokenize` (SGLang's shapes). Then real HTTP on
loopback: the proxy in front of prism-sim served with one tokenizer or another, which
counts the requests it gets by path and records whether a `/generate` carried
`input_ids` (the only way the proxy's own ids reach an engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from proxy_support import eventually, loopback_app, proxy_config, recording_generate
from tokenizer_dirs import write_bpe_dir, write_wordpiece_dir

from loadgen.stack.processes import free_port
from prism_proxy.app import start_proxy
from prism_proxy.backend.tokenizer_choice import TokenizerMismatch, TokenizerState
from prism_proxy.backend.tokenizer_guard import TokenizerCheck
from prism_proxy.edge.gateway import GATEWAY
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.server import create_app, start_site
from prism_tokens.builtin import CHATML_TEMPLATE, ensure_builtin
from prism_tokens.tokenizer import (
    BUILTIN,
    Tokenizer,
    default_cache_dir,
    load_model_dir,
    load_tokenizer,
)
from prism_tokens.verify import (
    PROBE_CHATS,
    PROBE_TEXTS,
    ChatResult,
    Tokenization,
    compare,
    tokenize_probes,
)

SPEED = 200.0
CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "Où est la gare ? 12 345 km, ok?"},
    ],
    "max_tokens": 3,
}
HINT = {"segments": [{"id": "doc", "text": "A document."}]}
# Qwen2.5's template writes a default system prompt when the chat has none: the
# builtin's vocabulary with this template renders other prompts.
DEFAULT_SYSTEM = "You are a helpful assistant."
VARIANT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}{%- endif %}"
) + CHATML_TEMPLATE


def write_variant_dir(directory: Path) -> Path:
    """The builtin tokenizer's `tokenizer.json` with another chat template."""
    directory.mkdir(parents=True, exist_ok=True)
    builtin = ensure_builtin(default_cache_dir())
    shutil.copyfile(builtin / "tokenizer.json", directory / "tokenizer.json")
    config = json.loads((builtin / "tokenizer_config.json").read_text())
    config["chat_template"] = VARIANT_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Model directories of four tokenizers, by name; `builtin` is the builtin's spec."""
    root = tmp_path_factory.mktemp("tokenizers")
    return {
        "builtin": BUILTIN,
        "bpe": str(write_bpe_dir(root / "bpe")),
        "wordpiece": str(write_wordpiece_dir(root / "wordpiece")),
        "variant": str(write_variant_dir(root / "variant")),
    }


def _load(spec: str) -> Tokenizer:
    return load_tokenizer(spec)


# --- the comparison (pure) --------------------------------------------------------------
def test_a_tokenizer_matches_itself(dirs: dict[str, str]) -> None:
    for spec in dirs.values():
        tokenizer = _load(spec)
        assert compare(tokenize_probes(tokenizer), tokenize_probes(_load(spec))).matches, spec


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [("builtin", "bpe"), ("bpe", "builtin"), ("builtin", "wordpiece"), ("bpe", "wordpiece")],
)
def test_other_vocabularies_differ_on_a_text_probe(dirs, ours: str, theirs: str) -> None:
    verdict = compare(tokenize_probes(_load(dirs[ours])), tokenize_probes(_load(dirs[theirs])))
    assert not verdict.matches
    assert verdict.difference.startswith("text probe ")


def test_the_same_vocabulary_with_another_template_differs_on_a_chat_probe(dirs) -> None:
    ours, theirs = tokenize_probes(_load("builtin")), tokenize_probes(_load(dirs["variant"]))
    assert ours.texts == theirs.texts
    verdict = compare(ours, theirs)
    assert not verdict.matches
    assert verdict.difference.startswith(f"chat probe {PROBE_CHATS[0][0]!r}")


def _tokenization(texts: list[tuple[int, ...]], chats: list[ChatResult]) -> Tokenization:
    return Tokenization(tuple(texts), tuple(chats))


def _same_texts() -> list[tuple[int, ...]]:
    return [(i, i + 1) for i in range(len(PROBE_TEXTS))]


@pytest.mark.parametrize(
    ("ours", "theirs", "matches"),
    [
        # only the engine renders it: the proxy sends such chats to the engine's endpoint
        (ChatResult(error="no chat_template"), ChatResult(ids=(5, 6)), True),
        (ChatResult(error="no chat_template"), ChatResult(error="HTTP 400: no template"), True),
        # only the proxy renders it: it would render prompts the engine does not
        (ChatResult(ids=(5, 6)), ChatResult(error="HTTP 400: no template"), False),
        (ChatResult(ids=(5, 6)), ChatResult(ids=(5, 6)), True),
        (ChatResult(ids=(5, 6)), ChatResult(ids=(5, 6, 7)), False),
    ],
)
def test_chat_probes_count_where_the_proxy_renders(ours, theirs, matches: bool) -> None:
    n = len(PROBE_CHATS)
    mine = _tokenization(_same_texts(), [ours] * n)
    engine = _tokenization(_same_texts(), [theirs] * n)
    assert compare(mine, engine).matches is matches


def test_the_difference_names_the_probe_and_the_first_token_that_differs() -> None:
    texts = _same_texts()
    other = list(texts)
    other[3] = (3, 9, 4)  # probe 3: (3, 4) here; the second token differs
    chats = [ChatResult(ids=(1,))] * len(PROBE_CHATS)
    verdict = compare(_tokenization(texts, chats), _tokenization(other, chats))
    assert verdict.difference == (
        f"text probe {PROBE_TEXTS[3][0]!r}: 2 tokens here, 3 in the engine; from token 1: "
        "[4] here, [9, 4] in the engine"
    )
    fewer = Tokenization(tuple(texts[:-1]), tuple(chats))
    assert not compare(_tokenization(texts, chats), fewer).matches


@pytest.mark.parametrize(
    ("state_", "downs", "seen", "stale"),
    [
        (None, 0, 1.0, True),  # never checked against the engine running now
        (TokenizerState.MATCH, 0, 1.0, False),
        (TokenizerState.MATCH, 1, 1.0, True),  # the engine went down since
        (TokenizerState.MATCH, 0, 2.0, True),  # it restarted
        (TokenizerState.MISMATCH, 0, 1.0, False),
        (TokenizerState.UNVERIFIED, 0, 1.0, False),
    ],
)
def test_a_check_is_stale_when_the_engine_may_have_changed(state_, downs, seen, stale) -> None:
    check = TokenizerCheck()
    check.record(state_, "", 0, 1.0)
    assert check.stale(downs, seen) is stale
    assert check.open is (state_ in (TokenizerState.MATCH, TokenizerState.UNVERIFIED))


def test_the_mismatch_setting_takes_refuse_or_forward() -> None:
    from prism_proxy.config import ConfigError
    from prism_proxy.config_sources import parse_serve_args

    assert parse_serve_args([], environ={}).tokenizer_mismatch == "refuse"
    env = {"PRISM_TOKENIZER_MISMATCH": "forward"}
    assert parse_serve_args([], environ=env).tokenizer_mismatch == "forward"
    with pytest.raises(ConfigError, match="tokenizer_mismatch"):
        parse_serve_args(["--set", "tokenizer_mismatch=ignore"], environ={})


# --- prism-sim's tokenize endpoints ---------------------------------------------------------
@dataclass
class Seen:
    """What a prism-sim got: requests by path, and `/generate` bodies with `input_ids`."""

    paths: Counter[str] = field(default_factory=Counter)
    generate_ids: int = 0


def counting(seen: Seen) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def count(request: web.Request, handler) -> web.StreamResponse:
        seen.paths[request.path] += 1
        if request.path == "/generate":
            body = json.loads(await request.read())
            seen.generate_ids += "input_ids" in body
        return await handler(request)

    return count


@contextlib.asynccontextmanager
async def sim_at(
    port: int, tokenizer: Tokenizer, seen: Seen, model: str | None = None
) -> AsyncIterator[str]:
    """prism-sim in-process on `port` (0: any) serving `tokenizer`; its `/model_info`
    names `model` as the tokenizer path when given (else the tokenizer's name)."""
    config = SimConfig(speed=SPEED, tokenizer=model)
    app = create_app(config, SimEngine(config, tokenizer=tokenizer))
    app.middlewares.append(counting(seen))
    runner = await start_site(app, "127.0.0.1", port)
    try:
        host, bound = runner.addresses[0][:2]
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()


async def post(url: str, body: object, headers: dict | None = None) -> tuple[int, dict, dict]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers) as response,
    ):
        return response.status, await response.json(content_type=None), dict(response.headers)


async def test_prism_sim_tokenizes_as_its_tokenizer(dirs) -> None:
    tokenizer = _load(dirs["bpe"])
    seen = Seen()
    async with sim_at(0, tokenizer, seen) as url:
        texts = [text for _, text in PROBE_TEXTS]
        status, answer, _ = await post(url + "/v1/tokenize", {"prompt": texts})
        assert status == 200
        assert answer["tokens"] == [tokenizer.encode(t, add_special_tokens=True) for t in texts]
        assert answer["count"] == [len(ids) for ids in answer["tokens"]]
        status, one, _ = await post(url + "/tokenize", {"prompt": "hello world"})
        assert (status, one["tokens"]) == (200, tokenizer.encode("hello world"))
        # a chat as a chat completion renders it: the sim's own chat answer agrees
        messages = CHAT["messages"]
        status, chat, _ = await post(url + "/v1/tokenize", {"messages": messages})
        rendered = tokenizer.render_chat([dict(m) for m in messages])
        assert (status, chat["tokens"]) == (200, tokenizer.encode(rendered))
        status, completion, _ = await post(url + "/v1/chat/completions", CHAT)
        assert completion["usage"]["prompt_tokens"] == chat["count"]
        # add_generation_prompt given: rendered with it
        body = {"messages": messages, "add_generation_prompt": False}
        status, open_turn, _ = await post(url + "/v1/tokenize", body)
        without = tokenizer.render_chat([dict(m) for m in messages], add_generation_prompt=False)
        assert open_turn["tokens"] == tokenizer.encode(without)
        status, text, _ = await post(url + "/v1/detokenize", {"tokens": chat["tokens"]})
        assert text["text"] == tokenizer.decode(chat["tokens"], skip_special_tokens=True)
        status, texts_back, _ = await post(url + "/detokenize", {"tokens": answer["tokens"]})
        assert status == 200 and len(texts_back["text"]) == len(texts)
        for bad in ({}, {"prompt": "x", "messages": messages}, {"messages": []}):
            status, error, _ = await post(url + "/v1/tokenize", bad)
            assert status == 400, (bad, error)


# --- the proxy in front of prism-sim ----------------------------------------------------------
def proxy_settings(backend: str, **overrides: object):
    """The tests' settings without a tokenizer: the default (`auto`) unless given."""
    return proxy_config(backend, **overrides)


async def sim_prompt_tokens(url: str, chat: dict) -> int:
    status, answer, _ = await post(url + "/v1/chat/completions", chat)
    assert status == 200, answer
    return answer["usage"]["prompt_tokens"]


def gauge(proxy, name: str, **labels: str) -> float | None:
    return proxy.app[GATEWAY].metrics.registry.get_sample_value(name, labels)


@pytest.mark.parametrize("served", ["builtin", "variant", "bpe"])
async def test_auto_takes_the_engines_tokenizer(dirs, served: str) -> None:
    """No tokenizer given: the proxy tokenizes as the engine does, so a chat through
    its token path has the engine's own prompt_tokens."""
    tokenizer = _load(dirs[served])
    seen = Seen()
    async with sim_at(0, tokenizer, seen) as url:
        proxy = await start_proxy(proxy_settings(url))
        try:
            assert proxy.app[GATEWAY].tokenizer.name == tokenizer.name
            assert proxy.app[GATEWAY].tokenizer_guard.check.state is TokenizerState.MATCH
            label = "builtin" if served == "builtin" else served
            assert gauge(proxy, "prism:tokenizer_verified", tokenizer=label) == 1
            status, answer, _ = await post(proxy.url + "/v1/chat/completions", CHAT)
            assert status == 200, answer
            assert seen.generate_ids == 1  # the token path: the proxy's ids ...
            # ... the engine's prompt: as many tokens as it renders itself
            assert answer["usage"]["prompt_tokens"] == await sim_prompt_tokens(url, CHAT)
        finally:
            await proxy.stop()


async def test_auto_refuses_to_start_when_no_candidate_matches(dirs) -> None:
    """The engine's directory is not readable here (its model_info names a hub id) and
    builtin has the engine's vocabulary but not its template: no start, the message
    names what was tried."""
    seen = Seen()
    tokenizer = load_model_dir(dirs["variant"], name="org/model")
    async with sim_at(0, tokenizer, seen, model="org/model") as url:
        with pytest.raises(TokenizerMismatch) as caught:
            await start_proxy(proxy_settings(url))
    message = str(caught.value)
    assert "'org/model'" in message and "builtin: chat probe" in message
    assert seen.generate_ids == 0 and seen.paths["/v1/tokenize"] >= 1


@pytest.mark.parametrize(
    ("served", "named"),
    [("bpe", "builtin"), ("builtin", "bpe"), ("builtin", "variant"), ("wordpiece", "bpe")],
)
async def test_a_wrong_tokenizer_is_refused_at_start(dirs, served: str, named: str) -> None:
    seen = Seen()
    async with sim_at(0, _load(dirs[served]), seen) as url:
        with pytest.raises(TokenizerMismatch) as caught:
            await start_proxy(proxy_settings(url, tokenizer=dirs[named]))
    message = str(caught.value)
    assert f"tokenizer {_load(dirs[named]).name!r} does not match" in message
    assert "probe" in message
    assert seen.paths["/generate"] == 0


async def test_forward_mode_serves_every_request_through_the_engines_endpoints(dirs) -> None:
    seen = Seen()
    async with sim_at(0, _load(dirs["bpe"]), seen) as url:
        proxy = await start_proxy(
            proxy_settings(url, tokenizer="builtin", tokenizer_mismatch="forward")
        )
        try:
            guard = proxy.app[GATEWAY].tokenizer_guard
            assert guard.check.state is TokenizerState.MISMATCH
            assert gauge(proxy, "prism:tokenizer_verified", tokenizer="builtin") == 0
            assert gauge(proxy, "prism:token_path_open") == 0
            expected = await sim_prompt_tokens(url, CHAT)
            status, answer, headers = await post(proxy.url + "/v1/chat/completions", CHAT)
            assert status == 200, answer
            assert answer["usage"]["prompt_tokens"] == expected
            assert headers["x-prism-lane"] == "passthrough"
            # streamed chats, completions and native text go as the client wrote them
            stream = {**CHAT, "stream": True}
            async with (
                aiohttp.ClientSession() as session,
                session.post(proxy.url + "/v1/chat/completions", json=stream) as response,
            ):
                assert response.status == 200
                assert (await response.text()).rstrip().endswith("data: [DONE]")
            completion = {"model": "m", "prompt": "Once upon", "max_tokens": 2}
            status, answer, _ = await post(proxy.url + "/v1/completions", completion)
            assert status == 200, answer
            native = {"text": "Once upon", "sampling_params": {"max_new_tokens": 2}}
            status, answer, _ = await post(proxy.url + "/generate", native)
            assert status == 200, answer
            assert seen.paths["/generate"] == 1 and seen.generate_ids == 0
            # what needs the proxy's tokenizer is refused: hints, client token ids, top_k
            refused = [
                ("/v1/chat/completions", {**CHAT, "prism": HINT}),
                ("/generate", {"input_ids": [1, 2, 3]}),
                ("/v1/completions", {"model": "m", "prompt": [1, 2], "max_tokens": 1}),
                ("/v1/chat/completions", {**CHAT, "top_k": 5}),
            ]  # fmt: skip
            for path, body in refused:
                status, error, _ = await post(proxy.url + path, body)
                assert status == 503, (path, error)
                assert "tokenizer 'builtin' does not match" in error["error"]["message"]
            assert seen.generate_ids == 0
        finally:
            await proxy.stop()


@pytest.mark.parametrize("mode", ["refuse", "forward"])
async def test_an_engine_restarted_with_another_tokenizer_shuts_the_token_path(
    dirs, mode: str
) -> None:
    """The health probe sees the engine go and come back with another startup time: the
    check runs again; on a mismatch the token path shuts (503 naming the tokenizer, or
    forwarded), and opens again when the engine's own tokenizer is back."""
    port = free_port()
    builtin = _load("builtin")
    first, second, third = Seen(), Seen(), Seen()
    settings = proxy_settings(
        f"http://127.0.0.1:{port}", health_interval_s=0.05, tokenizer_mismatch=mode
    )
    async with sim_at(port, builtin, first):
        proxy = await start_proxy(settings)
    try:
        guard = proxy.app[GATEWAY].tokenizer_guard
        assert guard.check.state is TokenizerState.MATCH
        backend = proxy.app[GATEWAY].backend
        await eventually(lambda: backend.up is False, timeout_s=30.0)  # the probe saw it go
        async with sim_at(port, _load(dirs["bpe"]), second) as url:
            await eventually(lambda: guard.check.state is TokenizerState.MISMATCH, 30.0)
            assert gauge(proxy, "prism:tokenizer_verified", tokenizer="builtin") == 0
            status, answer, _ = await post(proxy.url + "/v1/chat/completions", CHAT)
            if mode == "refuse":
                assert status == 503 and "'builtin'" in answer["error"]["message"]
            else:
                assert status == 200
                assert answer["usage"]["prompt_tokens"] == await sim_prompt_tokens(url, CHAT)
            assert second.generate_ids == 0
        async with sim_at(port, builtin, third):
            await eventually(lambda: guard.check.state is TokenizerState.MATCH, 30.0)
            status, answer, _ = await post(proxy.url + "/v1/chat/completions", CHAT)
            assert status == 200 and third.generate_ids == 1
    finally:
        await proxy.stop()


async def test_a_request_after_a_failed_exchange_checks_before_sending_ids(dirs) -> None:
    """No periodic probes: the proxy learns of a restart from a failed exchange, and the
    next request that needs the token path runs the check first."""
    port = free_port()
    second = Seen()
    settings = proxy_settings(f"http://127.0.0.1:{port}")  # health_interval_s=0
    async with sim_at(port, _load("builtin"), Seen()):
        proxy = await start_proxy(settings)
    try:
        status, _, _ = await post(proxy.url + "/v1/chat/completions", CHAT)
        assert status == 502  # the engine is gone
        async with sim_at(port, _load(dirs["bpe"]), second):
            status, answer, _ = await post(proxy.url + "/v1/chat/completions", CHAT)
            assert status == 503 and "'builtin'" in answer["error"]["message"]
            assert second.paths["/v1/tokenize"] >= 1 and second.paths["/generate"] == 0
    finally:
        await proxy.stop()


async def test_an_engine_down_at_start_is_checked_when_it_answers(dirs) -> None:
    port = free_port()
    seen = Seen()
    proxy = await start_proxy(proxy_settings(f"http://127.0.0.1:{port}", tokenizer="builtin"))
    try:
        assert proxy.app[GATEWAY].tokenizer_guard.check.state is None
        assert gauge(proxy, "prism:token_path_open") == 0
        status, _, _ = await post(proxy.url + "/v1/chat/completions", CHAT)
        assert status == 502
        async with sim_at(port, _load("builtin"), seen):
            status, _, _ = await post(proxy.url + "/v1/chat/completions", CHAT)
            assert status == 200 and seen.generate_ids == 1
            assert proxy.app[GATEWAY].tokenizer_guard.check.state is TokenizerState.MATCH
    finally:
        await proxy.stop()


# --- an engine that cannot tokenize -------------------------------------------------------------
def untokenizing_engine(model_path: str, bodies: list[dict]) -> web.Application:
    """An engine without `/v1/tokenize` (an older server, a gateway that does not route
    it): `/model_info`, `/server_info` and a `/generate` that records what it gets."""
    app = web.Application()

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": model_path, "tokenizer_path": model_path})

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({"startup_time": 1.0})

    app.router.add_get("/model_info", model_info)
    app.router.add_get("/server_info", server_info)
    app.router.add_post("/generate", recording_generate(bodies.append))
    return app


async def test_a_named_tokenizer_is_used_unverified_when_the_engine_cannot_tokenize() -> None:
    bodies: list[dict] = []
    async with loopback_app(untokenizing_engine("org/model", bodies)) as url:
        proxy = await start_proxy(proxy_settings(url, tokenizer="builtin"))
        try:
            assert proxy.app[GATEWAY].tokenizer_guard.check.state is TokenizerState.UNVERIFIED
            assert gauge(proxy, "prism:tokenizer_verified", tokenizer="builtin") == -1
            assert gauge(proxy, "prism:token_path_open") == 1
            status, answer, _ = await post(proxy.url + "/v1/chat/completions", CHAT)
            assert status == 200, answer
            assert "input_ids" in bodies[0]
        finally:
            await proxy.stop()


async def test_auto_without_a_check_takes_only_the_engines_own_directory() -> None:
    bodies: list[dict] = []
    async with loopback_app(untokenizing_engine("org/model", bodies)) as url:
        with pytest.raises(TokenizerMismatch, match=r"cannot tokenize.*'org/model'"):
            await start_proxy(proxy_settings(url))
    directory = str(ensure_builtin(default_cache_dir()))
    async with loopback_app(untokenizing_engine(directory, bodies)) as url:
        proxy = await start_proxy(proxy_settings(url))
        try:
            assert proxy.app[GATEWAY].tokenizer.name == directory
            assert proxy.app[GATEWAY].tokenizer_guard.check.state is TokenizerState.UNVERIFIED
        finally:
            await proxy.stop()
    assert bodies == []


async def test_concurrent_requests_share_one_check(dirs) -> None:
    """After the engine went down, the requests that arrive together wait for one check."""
    port = free_port()
    seen = Seen()
    async with sim_at(port, _load("builtin"), Seen()):
        proxy = await start_proxy(proxy_settings(f"http://127.0.0.1:{port}"))
    try:
        await post(proxy.url + "/v1/chat/completions", CHAT)  # 502: seen down
        async with sim_at(port, _load("builtin"), seen):
            results = await asyncio.gather(
                *(post(proxy.url + "/v1/chat/completions", CHAT) for _ in range(8))
            )
            assert [status for status, _, _ in results] == [200] * 8
            # one check: the probe texts in one call, each chat probe in one
            assert seen.paths["/v1/tokenize"] == 1 + len(PROBE_CHATS)
    finally:
        await proxy.stop()


async def test_an_engine_failing_the_check_gets_no_ids_and_its_error_is_the_answer() -> None:
    """An engine that answers 500 to everything has not answered the check: the proxy
    starts (a named tokenizer), and a request that needs the token path asks again and
    gets the engine's failure, with no `/generate` sent."""
    calls: list[str] = []

    async def failing(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.json_response({"error": {"message": "engine exploded"}}, status=500)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", failing)
    async with loopback_app(app) as url:
        proxy = await start_proxy(proxy_settings(url, tokenizer="builtin"))
        try:
            assert proxy.app[GATEWAY].tokenizer_guard.check.state is None
            calls.clear()
            status, answer, _ = await post(proxy.url + "/v1/chat/completions", CHAT)
            assert status == 502 and "engine exploded" in answer["error"]["message"]
            assert calls == ["/server_info"]
        finally:
            await proxy.stop()


async def test_a_named_tokenizer_that_cannot_be_loaded_stops_the_start(tmp_path) -> None:
    async with sim_at(0, _load("builtin"), Seen()) as url:
        with pytest.raises(RuntimeError, match="cannot load it"):
            await start_proxy(proxy_settings(url, tokenizer=str(tmp_path / "missing")))
