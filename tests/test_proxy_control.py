"""After each wave the proxy pushes P̂_t to the DART control RPC (SPEC §3, §4).

The receiving side here is a minimal loopback server speaking the control RPC contract
(`POST /prism/priorities {epoch, table, protect}`, bearer token, 409 on stale epochs);
a dead control endpoint must be counted and never stop serving."""

from __future__ import annotations

import time

import aiohttp
import pytest
from aiohttp import web
from proxy_support import (
    ProxyFactory,
    dart_stack,
    eventually,
    loopback_app,
    proxy_factory_fixture,
    sim_server,
)

from loadgen.stack.processes import free_port
from prism_proxy.edge.gateway import GATEWAY
from prism_wire import SYSTEM_OWNER_PREFIX

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

TOKEN = "s3cret"


def _control_app(received: list[dict]) -> web.Application:
    last_epoch = [-1]

    async def priorities(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.Response(status=401)
        body = await request.json()
        if body["epoch"] <= last_epoch[0]:
            return web.Response(status=409)
        last_epoch[0] = body["epoch"]
        received.append(body)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/prism/priorities", priorities)
    return app


def _chat(segments: list[str]) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 2,
        "prism": {"segments": [{"id": s, "text": f"text of {s}"} for s in segments]},
    }


async def test_waves_push_dispatch_priorities(proxy_factory: ProxyFactory) -> None:
    received: list[dict] = []
    async with loopback_app(_control_app(received)) as url:
        proxy = await proxy_factory(control_url=url, control_token=TOKEN, protect=5)
        async with aiohttp.ClientSession() as session:
            for segments in (["alpha", "beta"], ["beta", "gamma"]):
                async with session.post(
                    proxy.url + "/v1/chat/completions", json=_chat(segments)
                ) as response:
                    assert response.status == 200
        await eventually(lambda: len(received) >= 2)
        # the segments, and the chat template's head under its own owner
        heads = {key for body in received[:2] for key in body["table"] if key.startswith("\x00")}
        assert len(heads) == 1 and next(iter(heads)).startswith(SYSTEM_OWNER_PREFIX)
        assert [set(body["table"]) - heads for body in received[:2]] == [
            {"alpha", "beta"},
            {"beta", "gamma"},
        ]
        assert all(body["protect"] == 5 for body in received)
        epochs = [body["epoch"] for body in received]
        assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)
        # One request in the wave: P̂ = w_n·1 + w_g·1 for each of its segments (SPEC §3)
        # and for its head.
        assert received[0]["table"]["alpha"] == 1e5 + 1
        assert received[0]["table"][next(iter(heads))] == 1e5 + 1
        registry = proxy.app[GATEWAY].metrics.registry
        # the stub records a push before the proxy has read its answer and counted it
        await eventually(
            lambda: registry.get_sample_value("prism:control_rpc_pushes_total") == len(received)
        )
        assert registry.get_sample_value("prism:control_rpc_up") == 1


async def test_dead_control_endpoint_is_counted_not_fatal(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(control_url=f"http://127.0.0.1:{free_port()}")
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + "/v1/chat/completions", json=_chat(["alpha"])) as response,
    ):
        assert response.status == 200
    registry = proxy.app[GATEWAY].metrics.registry
    await eventually(lambda: registry.get_sample_value("prism:control_rpc_failures_total") == 1)
    assert registry.get_sample_value("prism:control_rpc_up") == 0


def test_pushes_reach_the_simulators_dart_control_rpc(tmp_path) -> None:
    """End to end with the real control RPC: `prism-sim --eviction dart --control-port`
    and `prism-proxy serve --control-url` as subprocesses; the engine accepts the
    proxy's tables and sees the anchors of the requests."""
    import httpx

    with dart_stack(tmp_path, TOKEN, ["--set", "protect=3"]) as (proxy, _, control_url):
        for segments in (["alpha", "beta"], ["beta", "gamma"]):
            response = httpx.post(
                proxy.url + "/v1/chat/completions", json=_chat(segments), timeout=30
            )
            assert response.status_code == 200
        auth = {"Authorization": f"Bearer {TOKEN}"}
        deadline = time.monotonic() + 20
        while True:
            metrics = httpx.get(proxy.url + "/metrics").text
            if "prism:control_rpc_pushes_total 2.0" in metrics:
                break
            assert time.monotonic() < deadline, metrics
            time.sleep(0.05)
        stats = httpx.get(control_url + "/prism/stats", headers=auth).json()
        assert stats["accepted_epoch"] > 0 and stats["protect"] == 3
        # The anchors rode in kv_hints: DART annotated the requests' segment nodes.
        assert stats["anchors_resident"] > 0
        assert "prism:control_rpc_failures_total 0.0" in metrics
        assert "prism:control_rpc_up 1.0" in metrics


async def test_server_info_reports_the_settings_in_effect(proxy_factory: ProxyFactory) -> None:
    """GET /server_info's `prism.settings`: the QAS variant and its resolved parameters,
    pacing (fixed or automatic, with the current value), the window, the residency
    source and the control RPC, as the proxy runs them (a sweep stores them)."""
    from prism_proxy.qas.params import qas_params

    async with loopback_app(_control_app([])) as url:
        with_dart = await proxy_factory(control_url=url, control_token=TOKEN, window_ms=7)
        own_view = await proxy_factory(
            qas_variant="residency", qas=qas_params("residency", {"cold_deadline_ms": 500})
        )
        fixed = await proxy_factory(policy="fifo", prefill_batch=16, max_inflight=40)
        async with aiohttp.ClientSession() as session:
            infos = []
            for proxy in (with_dart, own_view, fixed):
                async with session.get(proxy.url + "/server_info") as response:
                    assert response.status == 200
                    infos.append((await response.json())["prism"]["settings"])
    dart, view, fifo = infos
    assert dart["policy"] == "prism" and dart["qas_variant"] == "full"
    assert dart["qas"]["w_c"] == 1e4 and dart["qas"]["cold_deadline_ms"] == 2000.0
    assert dart["qas"]["canonical_ties"] is True and dart["window_ms"] == 7
    assert dart["residency"] == "dart" and dart["control_rpc"] is True
    assert dart["prefill_batch"]["mode"] == "auto" and dart["prefill_batch"]["value"] >= 1
    assert dart["backstop"]["mode"] == "auto"
    # The simulated engine's max_running_requests (learned from its /server_info).
    backend = with_dart.app[GATEWAY].admission.pacing
    assert dart["backstop"]["value"] == backend.backstop > 0
    assert view["qas_variant"] == "residency" and view["qas"]["cold_deadline_ms"] == 500
    assert view["qas"]["canonical_ties"] is False
    assert view["residency"] == "view" and view["control_rpc"] is False
    assert fifo["policy"] == "fifo" and fifo["residency"] == "none"
    assert fifo["prefill_batch"] == {"mode": "fixed", "value": 16}
    assert fifo["backstop"] == {"mode": "fixed", "value": 40}
    assert fifo["window_ms"] == 10.0 and fifo["control_rpc"] is False
