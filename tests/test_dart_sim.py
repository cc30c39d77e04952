"""`prism-sim --eviction dart` end to end: a real server subprocess on loopback, anchors in
`/generate`'s `kv_hints`, the priority table pushed through the control RPC, memory
pressure from fresh prompts, and the realized `cached_tokens` afterwards (SPEC §3, §7).

Capacity 64 tokens. Four requests S+A+pA ... S+D+pD (8 + 6 + 4 prompt tokens, one
generated token each) fill 8 + 4 x 11 = 52. Table {A: 40, B: 10, C: 30, D: 20}, f = 2,
so F_t = {A, C} (12 tokens, within the cap 0.25 x 64 = 16; the head S has no entry). A
fresh 40-token prompt then needs 41 - (64 - 52) = 29 tokens of room: DART drops the four
private suffixes (with their generated token: 20), then B and D (lowest priorities, 12),
and keeps A, so S+A+q hits 14 cached tokens and S+B+q only 8.
Plain LRU drops request A first (the oldest), so the A probe hits only 8.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.stack.processes import free_port, run_server
from prism_wire import make_kv_hints

TOKEN = "sim-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SYSTEM = list(range(1000, 1008))
SEGMENTS = {name: list(range(2000 + 10 * i, 2006 + 10 * i)) for i, name in enumerate("ABCD")}


def anchors(seg: str, private_len: int) -> list[dict]:
    return [
        {"kind": "system", "segment_id": "h", "offset": 8},
        {"kind": "segment", "segment_id": seg, "offset": 14},
        {"kind": "private", "segment_id": None, "offset": 14 + private_len},
    ]


def generate(client: httpx.Client, rid: str, ids: list[int], kv_hints=None) -> dict:
    body = {"rid": rid, "input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
    if kv_hints is not None:
        body["kv_hints"] = kv_hints
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def run_scenario(eviction: str, tmp_path) -> tuple[dict[str, int], dict | None]:
    control_port = free_port()
    args = [
        "--eviction",
        eviction,
        "--kv-capacity-tokens",
        "64",
        "--max-running-requests",
        "1",
        "--speed",
        "50",
    ]
    if eviction == "dart":  # prism-sim refuses a control port without DART
        args += ["--control-port", str(control_port)]
    with (
        run_server(
            "prism_sim",
            args,
            log_dir=tmp_path,
            name=f"sim-{eviction}",
            env={"PRISM_CONTROL_TOKEN": TOKEN},
        ) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        for i, seg in enumerate("ABCD"):
            ids = SYSTEM + SEGMENTS[seg] + [3000 + 10 * i + k for k in range(4)]
            meta = generate(client, f"r{seg}", ids, make_kv_hints(anchors(seg, 4), message_id=seg))
            assert meta["prompt_tokens"] == 18
        stats = None
        if eviction == "dart":
            control = httpx.Client(base_url=f"http://127.0.0.1:{control_port}", timeout=10)
            with control:
                body = {"epoch": 1, "table": {"A": 40, "B": 10, "C": 30, "D": 20}, "protect": 2}
                assert control.post("/prism/priorities", json=body, headers=AUTH).status_code == 200
                assert control.post("/prism/priorities", json=body, headers=AUTH).status_code == 409
        generate(client, "fresh", [5000 + k for k in range(40)])
        cached = {
            seg: generate(
                client, f"probe{seg}", SYSTEM + SEGMENTS[seg] + [7000 + k for k in range(3)]
            )["cached_tokens"]
            for seg in "AB"
        }
        if eviction == "dart":
            with httpx.Client(base_url=f"http://127.0.0.1:{control_port}", timeout=10) as control:
                stats = control.get("/prism/stats", headers=AUTH).json()
                metrics = control.get("/prism/metrics", headers=AUTH).text
                names = {f.name for f in text_string_to_metric_families(metrics)}
                assert "prism:dart_evicted_tokens" in names  # counter family (+ _total sample)
                assert control.get("/prism/stats").status_code == 401
    return cached, stats


@pytest.mark.slow
def test_dart_keeps_the_high_priority_segment_that_lru_drops(tmp_path):
    dart_cached, stats = run_scenario("dart", tmp_path)
    lru_cached, _ = run_scenario("lru", tmp_path)
    assert dart_cached == {"A": 14, "B": 8}
    assert lru_cached["A"] == 8
    assert stats is not None and stats["epoch"] == 1
    evicted = stats["evicted_tokens"]
    assert evicted["private"] > 0 and evicted["segment"] >= 6 and evicted["protected"] == 0
    assert stats["protected_segments"] == ["A", "C"]
    assert stats["capacity_tokens"] == 64 and stats["protect_cap_tokens"] == 16


def test_sim_refuses_an_unauthenticated_control_rpc(tmp_path):
    args = ["--eviction", "dart", "--control-port", str(free_port())]
    with (
        pytest.raises(RuntimeError, match="exited"),
        run_server(
            "prism_sim",
            args,
            log_dir=tmp_path,
            startup_timeout_s=30,
            env={"PRISM_CONTROL_TOKEN": ""},
        ),
    ):
        pass


def test_engine_counts_a_request_in_a_t_until_it_finishes():
    """`lru+active` inside `SimEngine`: a_t rises at the first insertion of an anchored
    request and falls when the scheduler finishes it (the engine's `on_finish` hook)."""
    from prism_sim.engine import SimConfig, SimEngine
    from prism_tokens.tokenizer import load_tokenizer

    engine = SimEngine(SimConfig(eviction="lru+active"), tokenizer=load_tokenizer(None))
    core = engine.extension.core
    ids = SYSTEM + SEGMENTS["A"] + [3000, 3001, 3002, 3003]
    handle = engine.start(ids, 3, rid="r", kv_hints=make_kv_hints(anchors("A", 4), message_id="r"))
    plain = engine.start([7, 8, 9], 3, rid="plain")  # no anchors: never counted
    active, now = [], engine.loop.now()  # both have arrived
    while not (handle.req.finished and plain.req.finished):
        batch = engine.scheduler.next_batch(now)
        now += batch.duration_s
        engine.scheduler.complete_batch(batch, now)
        active.append((core.active_count("A"), core.stats().active_requests))
    assert active[0] == (1, 1)  # after the prefill
    assert active[-1] == (0, 0)  # after the last decode step
    assert handle.req.finish_reason["type"] == "length"
