"""The QAS admission loop with the real policies (SPEC §2 waves)."""

from __future__ import annotations

import asyncio

import pytest
from proxy_support import eventually

from prism_proxy.admission.core import AdmissionCore, PrefillPacing
from prism_proxy.admission.driver import AdmissionController, QueueFullError, ShuttingDownError
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.policies import make_policy
from prism_proxy.qas.types import QueuedRequest


def _controller(
    policy: str = "fifo",
    prefill_batch: int = 2,
    max_inflight: int | None = None,
    max_queue: int = 100,
    **kwargs,
) -> AdmissionController:
    core = AdmissionCore(
        make_policy(policy, QasParams()),
        PrefillPacing(prefill_batch, max_inflight),
        window_s=0.001,
        max_queue=max_queue,
    )
    return AdmissionController(core, metrics=ProxyMetrics.create(), **kwargs)


def _gauge(controller: AdmissionController, name: str) -> float:
    value = controller.metrics.registry.get_sample_value(name)
    assert value is not None
    return value


async def test_waves_are_paced_by_prefill_and_release_in_fifo_order() -> None:
    controller = _controller("fifo", prefill_batch=2)
    futures = [controller.submit(QueuedRequest(rid=f"r{i}", arrival=float(i))) for i in range(5)]
    wave = controller.run_round()
    assert wave is not None and [r.rid for r in wave.released] == ["r0", "r1"]
    assert [f.done() for f in futures] == [True, True, False, False, False]
    assert controller.run_round() is None  # two pending prefill: no round
    controller.first_token("r0")  # r0 decodes now: it no longer counts against B
    controller.run_round()
    assert [f.done() for f in futures] == [True, True, True, False, False]
    assert controller.inflight == 3 and controller.pending_prefill == 2
    assert controller.queue_depth == 2
    assert _gauge(controller, "prism:pending_prefill_requests") == 2
    assert _gauge(controller, "prism:prefill_batch") == 2
    assert (
        controller.metrics.registry.get_sample_value("prism:releases_total", {"lane": "cold"}) == 3
    )


async def test_prism_releases_skeleton_and_dispatch_priorities() -> None:
    controller = _controller("prism", prefill_batch=8)
    pushed: list[dict[str, float]] = []
    controller.on_wave = pushed.append
    a = controller.submit(QueuedRequest(rid="a", arrival=0.0, segments=("x", "hot")))
    b = controller.submit(QueuedRequest(rid="b", arrival=1.0, segments=("hot", "y")))
    controller.run_round()
    release_a, release_b = a.result(), b.result()
    # "hot" is queued twice (g=2) and lands first in both skeletons (front alignment).
    assert release_a.skeleton[0] == "hot" and release_b.skeleton[0] == "hot"
    assert set(release_a.skeleton) == {"x", "hot"}
    assert release_a.priorities["hot"] > release_a.priorities["x"]
    assert pushed and pushed[0]["hot"] == release_a.priorities["hot"]


async def test_run_loop_cancel_and_gauges_return_to_zero() -> None:
    controller = _controller("fifo", prefill_batch=1)
    task = asyncio.create_task(controller.run())
    order: list[str] = []
    done = asyncio.Event()  # holders keep their slot until the test says so

    async def client(rid: str, arrival: float) -> None:
        """What the edge's `Admitted` block does with the controller."""
        future = controller.admit(QueuedRequest(rid=rid, arrival=arrival))
        try:
            await future
        except asyncio.CancelledError:
            controller.withdraw(rid)
            raise
        try:
            order.append(rid)
            await done.wait()
        finally:
            controller.finish(rid)

    first = asyncio.create_task(client("a", 0.0))
    await eventually(lambda: order == ["a"])
    second = asyncio.create_task(client("b", 1.0))
    leaver = asyncio.create_task(client("c", 2.0))
    await eventually(lambda: controller.queue_depth == 2)
    leaver.cancel()  # still queued behind "a": must leave the queue
    with pytest.raises(asyncio.CancelledError):
        await leaver
    assert controller.queue_depth == 1 and controller.inflight == 1
    done.set()
    await asyncio.gather(first, second)
    assert order == ["a", "b"]
    assert _gauge(controller, "prism:queue_depth") == 0
    assert _gauge(controller, "prism:inflight_requests") == 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_queue_full_and_shutdown() -> None:
    controller = _controller("fifo", prefill_batch=1, max_queue=2)
    first = controller.submit(QueuedRequest(rid="a", arrival=0.0))
    with pytest.raises(ValueError, match="already in use"):
        controller.submit(QueuedRequest(rid="a", arrival=0.5))
    second = controller.submit(QueuedRequest(rid="b", arrival=1.0))
    with pytest.raises(QueueFullError):
        controller.submit(QueuedRequest(rid="c", arrival=2.0))
    controller.close()
    for waiting in (first, second):
        with pytest.raises(ShuttingDownError):
            await waiting
    with pytest.raises(ShuttingDownError):
        controller.submit(QueuedRequest(rid="d", arrival=4.0))


async def test_big_rounds_run_in_a_thread_and_tolerate_leavers() -> None:
    """With offloading forced, a request withdrawn while the worker thread plans is
    skipped at release; everyone else is released once, and the loop stays free."""
    import threading

    controller = _controller("prism", prefill_batch=8, offload_occurrences=0)
    loop = asyncio.get_running_loop()
    inner = controller.core.policy
    withdrawn = threading.Event()
    planner_threads: set[int] = set()

    class LeaverDuringPlan:
        name = "prism"

        def plan_round(self, queue, active, wave_size, now=None):
            planner_threads.add(threading.get_ident())
            if not withdrawn.is_set():
                loop.call_soon_threadsafe(lambda: (controller.withdraw("r1"), withdrawn.set()))
                withdrawn.wait(timeout=10)  # the event loop runs meanwhile
            return inner.plan_round(queue, active, wave_size, now=now)

    controller.core.policy = LeaverDuringPlan()
    futures = {
        f"r{i}": controller.submit(QueuedRequest(rid=f"r{i}", arrival=float(i), segments=("s",)))
        for i in range(3)
    }
    task = asyncio.create_task(controller.run())
    await asyncio.wait_for(asyncio.gather(futures["r0"], futures["r2"]), timeout=10)
    assert futures["r1"].cancelled()
    assert threading.get_ident() not in planner_threads
    assert controller.inflight == 2 and controller.queue_depth == 0
    for rid in ("r0", "r2"):
        controller.finish(rid)
    assert _gauge(controller, "prism:inflight_requests") == 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
