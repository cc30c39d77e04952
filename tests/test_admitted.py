"""`edge.admit.Admitted`: one admitted request's life, each event told once, with the
proxy's real admission loop, session keeper and account usage."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from prism_proxy.admission.driver import AdmissionController
from prism_proxy.admission.session_keeper import SessionKeeper
from prism_proxy.admission.sessions import SessionParams
from prism_proxy.config import ProxyConfig
from prism_proxy.edge.account_limits import AccountUsage, Limits
from prism_proxy.edge.admit import Admitted
from prism_proxy.edge.errors import STARTED
from prism_proxy.edge.openai_format import TokenUsage
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.prompts.conversation import Turns, turns_job
from prism_proxy.scheduling import admission_core
from prism_wire import Retention

TOKENS_PER_MINUTE = 20  # one answer of 14 tokens fits; charged twice, the key is refused


@dataclass
class _Proxy:
    """The parts of a gateway `Admitted` uses, each the proxy's own."""

    gateway: Any
    admission: AdmissionController
    keeper: SessionKeeper
    words: list[Retention]  # what the keeper sent DART's control RPC


@pytest.fixture
async def proxy() -> AsyncIterator[_Proxy]:
    config = ProxyConfig(
        backend="http://engine", policy="fifo", key_tokens_per_minute=TOKENS_PER_MINUTE
    )
    metrics = ProxyMetrics.create()
    admission = AdmissionController(admission_core(config), metrics=metrics)
    task = asyncio.create_task(admission.run())
    words: list[Retention] = []
    keeper = SessionKeeper(SessionParams(min_tokens=0, retain_from="call"), words.append)
    gateway = SimpleNamespace(
        admission=admission, usage=AccountUsage(), config=config, metrics=metrics, keys=None
    )
    try:
        yield _Proxy(gateway, admission, keeper, words)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _request(**headers: str) -> Any:
    request = make_mocked_request("POST", "/v1/chat/completions", headers=headers)
    request[STARTED] = time.monotonic()
    return request


def _admitted(proxy: _Proxy, request: Any, sessions: bool = True) -> Admitted:
    """A chat with tools of three turns (a real token job), from client-a."""
    job = turns_job(Turns(list(range(900)), (100, 400, 700)))
    queued = job.queued("r1", time.monotonic())
    keeper = proxy.keeper if sessions else None
    return Admitted(request, proxy.gateway, queued, "client-a", keeper=keeper, job=job)


def _sample(proxy: _Proxy, name: str, labels: dict[str, str]) -> float | None:
    return proxy.gateway.metrics.registry.get_sample_value(name, labels)


def _refused_now(proxy: _Proxy) -> bool:
    """Whether client-a's next request is over its tokens per minute."""
    limits = Limits(tokens_per_minute=TOKENS_PER_MINUTE)
    return proxy.gateway.usage.open("client-a", limits, time.monotonic()) is not None


async def test_each_event_is_told_once(proxy: _Proxy) -> None:
    admitted = _admitted(proxy, _request())
    async with admitted:
        assert admitted.lane is not None and admitted.sessions
        assert proxy.keeper.table.stats()["in_flight"] == 1
        assert proxy.admission.pending_prefill == 1
        admitted.first_token(5)
        admitted.first_token(7)  # a second call changes nothing
        assert proxy.admission.pending_prefill == 0
        admitted.tool_call(("search",))
        admitted.tool_call(("search", "fetch"))
        usage = TokenUsage(10, 4, 0)
        admitted.finish(usage, True, ("search",))
        admitted.finish(usage, True, ("search",))
    stats = proxy.keeper.table.stats()
    assert stats["in_flight"] == 0 and stats["paused"] == 1
    assert proxy.admission.inflight == 0
    lane = {"lane": admitted.lane}
    assert _sample(proxy, "prism:ttft_seconds_count", lane) == 1
    assert _sample(proxy, "prism:prompt_tokens_total", lane) == 10
    # charged once, to the key carried: 14 of its 20 tokens a minute are used
    assert not _refused_now(proxy)


async def test_a_second_charge_would_refuse_the_key(proxy: _Proxy) -> None:
    """The check above can fail: the same answer charged twice uses up the minute."""
    usage = proxy.gateway.usage
    for _ in range(2):
        usage.charge("client-a", 14, TOKENS_PER_MINUTE, time.monotonic())
    assert _refused_now(proxy)


async def test_leaving_without_finish_forgets_the_session(proxy: _Proxy) -> None:
    admitted = _admitted(proxy, _request())
    with pytest.raises(RuntimeError):
        async with admitted:
            admitted.first_token()
            raise RuntimeError("the stream broke")
    stats = proxy.keeper.table.stats()
    assert stats["in_flight"] == 0 and stats["paused"] == 0
    assert proxy.admission.inflight == 0


async def test_a_broken_answer_returned_normally_is_forgotten_too(proxy: _Proxy) -> None:
    async with _admitted(proxy, _request()):
        pass  # e.g. a relayed stream that ended in an error event
    stats = proxy.keeper.table.stats()
    assert stats["in_flight"] == 0 and stats["paused"] == 0


async def test_a_refused_request_leaves_no_session(proxy: _Proxy) -> None:
    admitted = _admitted(proxy, _request(**{"x-prism-ttft-slo-ms": "x"}))
    with pytest.raises(Exception, match="x-prism-ttft-slo-ms"):
        async with admitted:
            pass
    assert proxy.keeper.table.stats()["in_flight"] == 0
    assert proxy.admission.inflight == 0 and proxy.admission.queue_depth == 0


async def test_without_a_keeper_only_admission_and_accounting_are_told(proxy: _Proxy) -> None:
    admitted = _admitted(proxy, _request(), sessions=False)
    async with admitted:
        assert not admitted.sessions
        admitted.first_token()
        admitted.tool_call(("search",))
        admitted.finish(None)
    assert proxy.keeper.table.stats()["in_flight"] == 0 and proxy.words == []
    assert proxy.admission.inflight == 0
    assert _sample(proxy, "prism:ttft_seconds_count", {"lane": admitted.lane}) == 1
    assert _sample(proxy, "prism:prompt_tokens_total", {"lane": admitted.lane}) is None
