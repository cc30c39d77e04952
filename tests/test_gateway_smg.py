"""sgl-model-gateway (smg 1.13.0, its PyPI wheel: `make smg-peer`) in front of three
PRISM replicas (prism-sim + proxy each) on loopback.

* the probes smg sends answer from the proxies (server info with the proxy's state,
  loads with its queue);
* with `--policy consistent_hashing` and `X-SMG-Routing-Key` (`loadgen.clients.routing`),
  requests with the same anchor segment reach the same replica, different anchors
  spread, and the `prism` hints arrive intact (the repeat reuses the documents);
* every key reaches the replica `loadgen.clients.smg_ring.SmgRing` predicts, so a hot key's
  sub-keys (`loadgen.clients.hot_keys.spread_keys`) reach distinct replicas;
* streaming and client errors go through smg unharmed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import pytest
from proxy_support import proxy_config

from loadgen.clients.hot_keys import spread_keys
from loadgen.clients.routing import ROUTING_KEY_HEADER, routing_headers
from loadgen.clients.smg_ring import SmgRing
from loadgen.experiments.scale_out import gateway as smg_gateway
from loadgen.stack.processes import ServerProcess, run_server
from prism_proxy.app import RunningProxy, start_proxy
from prism_proxy.edge.gateway import GATEWAY

REPLICAS = 3
SIM_ARGS = ["--speed", "50", "--log-level", "warning"]
DOC = "Notes on {topic}: where it starts, how it grows, and what it leaves behind. " * 4


@pytest.fixture(scope="module")
def sims(tmp_path_factory) -> Iterator[list[ServerProcess]]:
    log_dir = tmp_path_factory.mktemp("replicas")
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(run_server("prism_sim", SIM_ARGS, log_dir=log_dir))
            for _ in range(REPLICAS)
        ]


def served(proxy: RunningProxy) -> float:
    registry = proxy.app[GATEWAY].metrics.registry
    return sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "prism:requests"
        for sample in metric.samples
        if sample.name == "prism:requests_total"
    )


def chat(model: str, docs: list[str], question: str, **extra) -> dict:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "Answer from the notes."},
            {"role": "user", "content": question},
        ],
        "max_tokens": 4,
        "prism": {"segments": [{"id": d, "text": DOC.format(topic=d)} for d in docs]},
        **extra,
    }


async def test_smg_routes_by_anchor_to_prism_replicas(sims, tmp_path) -> None:
    proxies = [await start_proxy(proxy_config(sim.url)) for sim in sims]
    try:
        with contextlib.ExitStack() as stack:
            # started from a thread: the proxies live on this loop and must answer its probes
            # no health checks: under a loaded suite a slow probe answer would make smg move
            # a key off its ring worker, and this test checks the ring's placement
            front = smg_gateway(
                [p.url for p in proxies], "consistent_hashing", tmp_path, ["--disable-health-check"]
            )
            gateway = await asyncio.to_thread(stack.enter_context, front)
            async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
                model = (await http.get("/v1/models")).json()["data"][0]["id"]
                ring = SmgRing(w["url"] for w in (await http.get("/workers")).json()["workers"])
                urls = [p.url for p in proxies]
                # the probes a gateway sends, answered by a proxy
                direct = httpx.AsyncClient(base_url=proxies[0].url)
                info = (await direct.get("/server_info")).json()
                assert info["prism"]["queue_depth"] == 0 and "internal_states" in info
                loads = (await direct.get("/v1/loads")).json()
                assert loads["loads"][0]["num_waiting_reqs"] == 0 and "prism" in loads
                assert (await direct.get("/get_model_info")).status_code == 200
                await direct.aclose()

                replicas_by_key: dict[str, set[int]] = {}
                for topic in ("rivers", "glaciers", "deserts", "reefs", "forests", "caves"):
                    docs = [f"{topic}-a", f"{topic}-b", f"{topic}-c"]
                    headers = routing_headers(docs)
                    cached = []
                    for question in ("What grows?", "What ends?"):
                        before = [served(p) for p in proxies]
                        answer = await http.post(
                            "/v1/chat/completions", json=chat(model, docs, question),
                            headers=headers,
                        )  # fmt: skip
                        assert answer.status_code == 200, answer.text
                        cached.append(answer.json()["usage"]["prompt_tokens_details"])
                        after = [served(p) for p in proxies]
                        hit = [i for i in range(REPLICAS) if after[i] > before[i]]
                        # which worker smg says it chose tells a wrong ring from a
                        # wrong count if this ever fails (it did once in a loaded suite)
                        routed = answer.headers.get("x-smg-routed-worker-id")
                        assert hit == [urls.index(ring.place(headers[ROUTING_KEY_HEADER]))], (
                            f"served by {hit}, smg routed to {routed}, ring: {urls}"
                        )
                        replicas_by_key.setdefault(headers[ROUTING_KEY_HEADER], set()).update(hit)
                    # the second request met the first's documents in that replica's cache
                    assert (cached[1] or {}).get("cached_tokens", 0) > 3 * 20
                assert all(len(replicas) == 1 for replicas in replicas_by_key.values())
                assert len(set().union(*replicas_by_key.values())) >= 2  # keys spread

                # a hot key's sub-keys land where the ring says: one per replica
                reached = []
                for key in spread_keys("rivers-a", ring.place, REPLICAS):
                    answer = await http.post(
                        "/v1/chat/completions", json=chat(model, ["rivers-a"], "Why?"),
                        headers={ROUTING_KEY_HEADER: key},
                    )  # fmt: skip
                    reached.append(answer.headers["x-smg-routed-worker-id"])
                    assert reached[-1] == ring.place(key)
                assert sorted(reached) == sorted(urls)

                stream = await http.post(
                    "/v1/chat/completions",
                    json=chat(model, ["x-a"], "Go on.", stream=True, max_tokens=6),
                    headers=routing_headers(["x-a"]),
                )
                events = [line for line in stream.text.splitlines() if line.startswith("data:")]
                assert stream.status_code == 200 and events[-1] == "data: [DONE]"
                assert len(events) >= 3

                bad = await http.post(
                    "/v1/chat/completions",
                    json=chat(model, ["x-a"], "Go on.", temperature=-1),
                    headers=routing_headers(["x-a"]),
                )
                assert bad.status_code == 400
                assert "temperature" in bad.text
    finally:
        for proxy in proxies:
            await proxy.stop()
