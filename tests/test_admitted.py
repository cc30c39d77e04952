"""`edge.admit.Admitted`: one admitted request's life, each event told once."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from prism_proxy.admission.core import Released
from prism_proxy.config import ProxyConfig
from prism_proxy.edge.account_limits import AccountUsage
from prism_proxy.edge.admit import Admitted
from prism_proxy.edge.errors import STARTED
from prism_proxy.edge.openai_format import TokenUsage
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.prompts.jobs import private_job
from prism_proxy.qas.types import Lane, QueuedRequest


class _Admission:
    """Releases every request at once; records what the edge tells it."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def admit(self, queued: QueuedRequest) -> asyncio.Future[Released]:
        self.events.append(("admit", queued.rid))
        future: asyncio.Future[Released] = asyncio.get_running_loop().create_future()
        future.set_result(Released(queued.rid, Lane.COLD, (), {}, 0.0))
        return future

    def first_token(self, rid: str, uncached: int | None = None) -> None:
        self.events.append(("first_token", rid, uncached))

    def withdraw(self, rid: str) -> None:
        self.events.append(("withdraw", rid))

    def finish(self, rid: str) -> None:
        self.events.append(("finish", rid))


class _Keeper:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def arrive(self, rid: str, keys: Any, head: str, tokens: int, client: str = "") -> None:
        self.events.append(("arrive", rid, client))

    def started(self, rid: str) -> None:
        self.events.append(("started", rid))

    def calling(self, rid: str, tools: Any = ()) -> None:
        self.events.append(("calling", rid, tuple(tools)))

    def finish(self, rid: str, tool_call: bool, tools: Any = ()) -> None:
        self.events.append(("finish", rid, tool_call, tuple(tools)))

    def forget(self, rid: str) -> None:
        self.events.append(("forget", rid))


class _Usage(AccountUsage):
    def __init__(self) -> None:
        super().__init__()
        self.charged: list[tuple[str, int, int]] = []

    def charge(self, account: str, tokens: int, tokens_per_minute: int, now: float) -> None:
        self.charged.append((account, tokens, tokens_per_minute))
        super().charge(account, tokens, tokens_per_minute, now)


def _setup(tokens_per_minute: int = 0) -> tuple[Any, Any, _Admission, _Keeper]:
    config = ProxyConfig(backend="http://engine", key_tokens_per_minute=tokens_per_minute)
    admission = _Admission()
    gateway = SimpleNamespace(
        admission=admission,
        usage=_Usage(),
        config=config,
        metrics=ProxyMetrics.create(),
        keys=None,
    )
    request = make_mocked_request("POST", "/v1/chat/completions")
    request[STARTED] = time.monotonic()
    return request, gateway, admission, _Keeper()


def _admitted(request: Any, gateway: Any, keeper: _Keeper | None) -> Admitted:
    job = private_job({"input_ids": [1, 2, 3]}, 3)
    queued = QueuedRequest(rid="r1", arrival=time.monotonic())
    return Admitted(request, gateway, queued, "client-a", keeper=keeper, job=job)  # type: ignore[arg-type]


def _sample(gateway: Any, name: str, labels: dict[str, str]) -> float | None:
    return gateway.metrics.registry.get_sample_value(name, labels)


async def test_each_event_is_told_once_in_order() -> None:
    request, gateway, admission, keeper = _setup(tokens_per_minute=1000)
    admitted = _admitted(request, gateway, keeper)
    async with admitted:
        assert admitted.lane == "cold" and admitted.sessions
        admitted.first_token(5)
        admitted.first_token(7)  # a second call changes nothing
        admitted.tool_call(("search",))
        admitted.tool_call(("search", "fetch"))
        usage = TokenUsage(10, 4, 0)
        admitted.finish(usage, True, ("search",))
        admitted.finish(usage, True, ("search",))
    assert admission.events == [
        ("admit", "r1"),
        ("first_token", "r1", 5),
        ("finish", "r1"),
    ]
    assert keeper.events == [
        ("arrive", "r1", "client-a"),
        ("started", "r1"),
        ("calling", "r1", ("search",)),
        ("finish", "r1", True, ("search",)),
    ]
    assert _sample(gateway, "prism:ttft_seconds_count", {"lane": "cold"}) == 1
    assert _sample(gateway, "prism:prompt_tokens_total", {"lane": "cold"}) == 10
    # the tokens are charged once, to the key carried (not derived again)
    assert gateway.usage.charged == [("client-a", 14, 1000)]


async def test_leaving_without_finish_forgets_the_session() -> None:
    request, gateway, admission, keeper = _setup()
    admitted = _admitted(request, gateway, keeper)
    with pytest.raises(RuntimeError):
        async with admitted:
            admitted.first_token()
            raise RuntimeError("the stream broke")
    assert keeper.events == [("arrive", "r1", "client-a"), ("started", "r1"), ("forget", "r1")]
    assert admission.events[-1] == ("finish", "r1")


async def test_a_broken_answer_returned_normally_is_forgotten_too() -> None:
    request, gateway, _, keeper = _setup()
    async with _admitted(request, gateway, keeper):
        pass  # e.g. a relayed stream that ended in an error event
    assert keeper.events == [("arrive", "r1", "client-a"), ("forget", "r1")]


async def test_a_refused_request_leaves_no_session() -> None:
    _, gateway, admission, keeper = _setup()
    bad = make_mocked_request("POST", "/v1/chat/completions", headers={"x-prism-ttft-slo-ms": "x"})
    admitted = _admitted(bad, gateway, keeper)
    with pytest.raises(Exception, match="x-prism-ttft-slo-ms"):
        async with admitted:
            pass
    assert keeper.events == [("arrive", "r1", "client-a"), ("forget", "r1")]
    assert admission.events == []


async def test_without_a_keeper_only_admission_and_accounting_are_told() -> None:
    request, gateway, admission, _ = _setup()
    admitted = _admitted(request, gateway, None)
    async with admitted:
        assert not admitted.sessions
        admitted.first_token()
        admitted.tool_call(("search",))
        admitted.finish(None)
    assert admission.events == [("admit", "r1"), ("first_token", "r1", None), ("finish", "r1")]
    assert _sample(gateway, "prism:prompt_tokens_total", {"lane": "cold"}) is None
