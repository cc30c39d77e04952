"""Client API keys through the real proxy on prism-sim with the real `openai` client
(issue 36): 401 without an accepted key on every client path, per-key limits answered
429 with Retry-After, and the fair share letting a steady key past a flood's backlog."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from proxy_support import ProxyFactory, eventually, proxy_factory_fixture

from loadgen.stack.processes import ServerProcess, run_server
from prism_proxy.edge.gateway import GATEWAY


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """prism-sim in real time (the A800 model): a long answer holds its request in
    flight for seconds, so a test can hold one while it asks again."""
    args = ["--speed", "1", "--log-level", "warning"]
    with run_server("prism_sim", args, log_dir=tmp_path_factory.mktemp("sim")) as server:
        yield server


proxy_factory = pytest.fixture(proxy_factory_fixture)

MESSAGES = [{"role": "user", "content": "Say something about the sea."}]


def _client(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


async def test_wrong_or_missing_key_is_401_on_every_client_path(
    proxy_factory: ProxyFactory,
) -> None:
    proxy = await proxy_factory(api_keys="sk-good")
    async with _client(proxy.url, "sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        error = caught.value.body
        assert isinstance(error, dict) and error["code"] == "invalid_api_key"
        assert error["type"] == "invalid_request_error"
        with pytest.raises(openai.AuthenticationError):
            await client.completions.create(model="m", prompt="The sea", max_tokens=4)
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
    async with _client(proxy.url, "sk-good") as client:
        answer = await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert answer.choices[0].message.content
        assert (await client.models.list()).data
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as http:
        body = {"text": "The sea", "sampling_params": {"max_new_tokens": 4}}
        missing = await http.post("/generate", json=body)
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "invalid_api_key"
        other = await http.post("/generate", json=body, headers={"x-api-key": "sk-good"})
        assert other.status_code == 200
        assert (await http.get("/health")).status_code == 200  # stays open
        metrics = (await http.get("/metrics")).text
        refused = [
            line
            for line in metrics.splitlines()
            if line.startswith("prism:requests_total{")
            and 'endpoint="chat"' in line
            and 'status="401"' in line
        ]
        assert refused and float(refused[0].rsplit(" ", 1)[1]) == 1.0


async def test_per_key_in_flight_limit_is_429_with_retry_after(
    proxy_factory: ProxyFactory, tmp_path: object
) -> None:
    """The key file gives `capped` one request in flight; `free` has the default (none).
    A stream held open keeps capped's one request in flight."""
    path = tmp_path / "keys"  # type: ignore[operator]
    digest = hashlib.sha256(b"sk-capped").hexdigest()
    path.write_text(f"sha256:{digest} name=capped max_inflight=1\n")
    proxy = await proxy_factory(api_keys_file=str(path), api_keys="sk-free")
    usage = proxy.app[GATEWAY].usage
    async with _client(proxy.url, "sk-capped") as capped, _client(proxy.url, "sk-free") as free:
        stream = await capped.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=4000, stream=True
        )
        await anext(aiter(stream))
        with pytest.raises(openai.RateLimitError) as caught:
            await capped.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert caught.value.response.headers["Retry-After"] == "1"
        assert caught.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
        served = await free.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert served.choices[0].finish_reason
        await stream.close()
        await eventually(lambda: usage.holding("capped") == (0, 0))
        again = await capped.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert again.choices[0].finish_reason


async def test_tokens_per_minute_is_429_once_used(proxy_factory: ProxyFactory) -> None:
    """One token a minute: the first answer is admitted and charged its prompt and
    completion tokens (more than one), so the bucket is empty for many seconds and the
    next request gets 429 with the refill time as Retry-After."""
    proxy = await proxy_factory(api_keys="sk-tpm", key_tokens_per_minute=1)
    async with _client(proxy.url, "sk-tpm") as client:
        first = await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert first.usage is not None and first.usage.total_tokens > 1
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        # 60 s per token refilled: at least a minute for the one token the answer overdrew
        assert int(caught.value.response.headers["Retry-After"]) >= 60
        assert "tokens_per_minute" in caught.value.message


async def test_a_stream_without_usage_is_charged_all_the_same(
    proxy_factory: ProxyFactory,
) -> None:
    """A chat with tools, which the engine's own endpoint serves, streamed by a client
    that did not ask for usage: the proxy asks the engine for it, charges the answer's
    tokens to the key, and relays the stream without the usage chunk. (Without the ask
    such a client was never charged.)"""
    proxy = await proxy_factory(api_keys="sk-tpm", key_tokens_per_minute=1)
    tool = {"type": "function", "function": {"name": "look_up", "parameters": {"type": "object"}}}
    async with _client(proxy.url, "sk-tpm") as client:
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=4, tools=[tool], stream=True
        )
        chunks = [chunk async for chunk in stream]
        assert chunks and all(chunk.choices for chunk in chunks)
        assert all(chunk.usage is None for chunk in chunks)
        admission = proxy.app[GATEWAY].admission
        await eventually(lambda: admission.inflight == 0)  # the answer has ended: charged
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert "tokens_per_minute" in caught.value.message


async def test_a_streamed_generate_batch_is_charged_its_answers_tokens(
    proxy_factory: ProxyFactory,
) -> None:
    """A batch on SGLang's `/generate`, which the engine's own endpoint serves, streamed:
    each answer's last `meta_info` holds its tokens, and the key is charged their sum
    (the `prism:prompt_tokens` counter counts them too)."""
    proxy = await proxy_factory(api_keys="sk-tpm", key_tokens_per_minute=1)
    headers = {"Authorization": "Bearer sk-tpm"}
    body = {"text": ["The sea", "The sky is"], "stream": True,
            "sampling_params": {"max_new_tokens": 3}}  # fmt: skip
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0, headers=headers) as http:
        async with http.stream("POST", "/generate", json=body) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
        chunks = [json.loads(line[5:]) for line in lines[:-1]]
        last = {chunk.get("index", 0): chunk["meta_info"] for chunk in chunks}
        assert sorted(last) == [0, 1] and all(meta["finish_reason"] for meta in last.values())
        admission = proxy.app[GATEWAY].admission
        await eventually(lambda: admission.inflight == 0)  # the answer has ended: charged
        again = await http.post("/generate", json={**body, "stream": False})
        assert again.status_code == 429
    registry = proxy.app[GATEWAY].metrics.registry
    counted = registry.get_sample_value("prism:prompt_tokens_total", {"lane": "passthrough"})
    assert counted == sum(meta["prompt_tokens"] for meta in last.values())


@pytest.mark.parametrize("fair_share", [True, False])
async def test_steady_key_released_past_a_floods_backlog(
    proxy_factory: ProxyFactory, fair_share: bool
) -> None:
    """One request at the engine at a time (B = backstop = 1, fifo). The flood sends 6
    long requests; once they have all arrived and at least 4 wait in the queue, the
    steady key sends one. With the fair share it is released within two releases, so
    flood requests that were queued before it finish after it; without, fifo serves
    the whole flood first."""
    proxy = await proxy_factory(
        api_keys="sk-flood,sk-steady",
        policy="fifo",
        prefill_batch=1,
        max_inflight=1,
        fair_share=fair_share,
    )
    admission = proxy.app[GATEWAY].admission
    done: list[str] = []

    async def ask(client: openai.AsyncOpenAI, name: str, max_tokens: int) -> None:
        await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=max_tokens)
        done.append(name)

    def flood_waiting() -> bool:
        arrived = len(done) + admission.queue_depth + admission.inflight == 6
        return arrived and admission.queue_depth >= 4

    async with _client(proxy.url, "sk-flood") as flood, _client(proxy.url, "sk-steady") as steady:
        flooding = [asyncio.create_task(ask(flood, "flood", 64)) for _ in range(6)]
        await eventually(flood_waiting, 30.0)
        steady_task = asyncio.create_task(ask(steady, "steady", 4))
        await asyncio.gather(*flooding, steady_task)
    flood_after = len(done) - 1 - done.index("steady")
    if fair_share:
        assert flood_after >= 1, done
    else:
        assert flood_after == 0, done


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of the sample `name` with exactly `labels` in Prometheus text (0 when
    absent: a counter not yet incremented)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


async def _scraped(http: httpx.AsyncClient, check: Callable[[str], bool]) -> str:
    """Scrape /metrics until `check` holds for its text (the gauges follow requests
    that the proxy's loop handles between scrapes); the text it held for."""
    for _ in range(1000):
        text = (await http.get("/metrics")).text
        if check(text):
            return text
        await asyncio.sleep(0.01)
    raise AssertionError(f"metrics never matched:\n{text}")


async def test_metrics_per_key_follow_requests(
    proxy_factory: ProxyFactory, tmp_path: object
) -> None:
    """Two keys, one request at the engine at a time (B = backstop = 1). `free` holds
    a long stream; `capped` (max_inflight 1) then queues one request behind it and is
    refused its second (429 by max_inflight); a wrong key is 401. The per-key series
    move with each step, and the tokens counted are those of the answers' usage."""
    path = tmp_path / "keys"  # type: ignore[operator]
    digest = hashlib.sha256(b"sk-capped").hexdigest()
    path.write_text(f"sha256:{digest} name=capped max_inflight=1\n")
    proxy = await proxy_factory(
        api_keys_file=str(path),
        api_keys="sk-free",
        prefill_batch=1,
        max_inflight=1,
    )
    free_name = next(name for name in proxy.app[GATEWAY].keys.accounts if name != "capped")

    def requests(text: str, account: str, status: str, limit: str = "none") -> float:
        return _sample(
            text, "prism:account_requests_total", account=account, status=status, limit=limit
        )

    def holding(text: str, account: str) -> tuple[float, float]:
        return (
            _sample(text, "prism:account_inflight_requests", account=account),
            _sample(text, "prism:account_queued_requests", account=account),
        )

    async with (
        _client(proxy.url, "sk-capped") as capped,
        _client(proxy.url, "sk-free") as free,
        httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as http,
    ):
        start = (await http.get("/metrics")).text
        assert holding(start, "capped") == (0, 0) and holding(start, free_name) == (0, 0)
        answer = await free.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert answer.usage is not None
        text = await _scraped(http, lambda t: requests(t, free_name, "200") == 1)
        tokens = {
            kind: _sample(text, "prism:account_tokens_total", account=free_name, kind=kind)
            for kind in ("prompt", "completion")
        }
        assert tokens == {
            "prompt": answer.usage.prompt_tokens,
            "completion": answer.usage.completion_tokens,
        }
        assert requests(text, "capped", "200") == 0

        stream = await free.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=4000, stream=True
        )
        await anext(aiter(stream))
        queued = asyncio.create_task(
            capped.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        )
        text = await _scraped(http, lambda t: holding(t, "capped") == (1, 1))
        assert holding(text, free_name) == (1, 0)
        with pytest.raises(openai.RateLimitError):
            await capped.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        async with _client(proxy.url, "sk-wrong") as wrong:
            with pytest.raises(openai.AuthenticationError):
                await wrong.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        text = (await http.get("/metrics")).text
        assert requests(text, "capped", "429", "max_inflight") == 1
        assert requests(text, "(unauthenticated)", "401") == 1

        await stream.close()
        assert (await queued).choices[0].finish_reason
        text = await _scraped(
            http,
            lambda t: (
                requests(t, "capped", "200") == 1
                and holding(t, "capped") == (0, 0)
                and holding(t, free_name) == (0, 0)
            ),
        )
        # the stream its client closed counts as 499 (as in prism:requests)
        assert requests(text, free_name, "499") == 1 and requests(text, free_name, "200") == 1


async def test_metrics_without_keys_count_every_client_as_addr(
    proxy_factory: ProxyFactory,
) -> None:
    """Without keys the account label is one value, `addr`, whatever the address."""
    proxy = await proxy_factory()
    async with (
        _client(proxy.url, "unused") as client,
        httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as http,
    ):
        answer = await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert answer.usage is not None
        text = await _scraped(
            http,
            lambda t: (
                _sample(
                    t, "prism:account_requests_total", account="addr", status="200", limit="none"
                )
                == 1
            ),
        )
        assert _sample(text, "prism:account_tokens_total", account="addr", kind="completion") == (
            answer.usage.completion_tokens
        )
        assert _sample(text, "prism:account_inflight_requests", account="addr") == 0
        accounts = {
            sample.labels["account"]
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith("prism:account_")
        }
        assert accounts == {"addr"}


async def test_metrics_name_the_limit_behind_each_429(proxy_factory: ProxyFactory) -> None:
    """One request at the engine (B = backstop = 1), one place in QAS's queue, one per
    key: `a` holds the engine with a stream, `b` takes the queue's one place; `b`'s next
    is over its own max_queued, `a`'s next finds the proxy's queue full."""
    proxy = await proxy_factory(
        api_keys="sk-a,sk-b",
        prefill_batch=1,
        max_inflight=1,
        max_queue=1,
        key_max_queued=1,
    )
    # each key's default account name: key-<first 8 hex digits of its digest>
    account = {key: "key-" + hashlib.sha256(key).hexdigest()[:8] for key in (b"sk-a", b"sk-b")}
    async with (
        _client(proxy.url, "sk-a") as a,
        _client(proxy.url, "sk-b") as b,
        httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as http,
    ):
        stream = await a.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=4000, stream=True
        )
        await anext(aiter(stream))
        queued = asyncio.create_task(
            b.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        )
        await _scraped(
            http,
            lambda t: _sample(t, "prism:account_queued_requests", account=account[b"sk-b"]) == 1,
        )
        with pytest.raises(openai.RateLimitError):
            await b.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        with pytest.raises(openai.RateLimitError):
            await a.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        text = (await http.get("/metrics")).text
        name = "prism:account_requests_total"
        assert _sample(text, name, account=account[b"sk-b"], status="429", limit="max_queued") == 1
        assert _sample(text, name, account=account[b"sk-a"], status="429", limit="max_queue") == 1
        await stream.close()
        assert (await queued).choices[0].finish_reason
