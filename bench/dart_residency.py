"""`python -m bench.dart_residency`: cost of DART's residency log at 10^5 anchors.

* transitions: 10^5 segments enter the tree (`DartCore.on_assign`, each a 0 -> >0
  transition), then leave it (`on_evicted`), with the log and with a log that records
  nothing; best of `--repeat` runs, ratio with/without;
* summaries with 10^5 resident: the full set and a delta of 100 changes (50 left, 50
  arrived), each as the RPC builds it (`residency_summary` + orjson), and the proxy's
  strict decode of the same bytes (`ResidencySummary.from_json`);
* memory (tracemalloc, segment-id strings included): the log with 10^5 resident, and
  after 10^6 transitions over 10^6 distinct segments (the change list stays at its
  bound of 2^17 entries).

    python -m bench.dart_residency [--anchors 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable

import orjson

from backend_plugin.dart import DartCore, NodeMeta
from backend_plugin.dart.residency import DEFAULT_MAX_ENTRIES, ResidencyLog
from prism_wire import AnchorKind, ResidencySummary

SEGMENT_TOKENS = 128


class NoLog(ResidencyLog):
    """The baseline: the core without the log's bookkeeping."""

    def record(self, segment: str, resident: bool) -> None:
        pass


def best_of(repeat: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeat))


def transitions(metas: list[NodeMeta], log: type[ResidencyLog], repeat: int) -> tuple[float, float]:
    """Best seconds for all `metas` entering, and for all leaving, one fresh core each."""
    enter: list[float] = []
    leave: list[float] = []
    for _ in range(repeat):
        core = DartCore(protect=8, residency=log())
        gc.collect()
        start = time.perf_counter()
        for meta in metas:
            core.on_assign(None, meta, SEGMENT_TOKENS)
        enter.append(time.perf_counter() - start)
        start = time.perf_counter()
        for meta in metas:
            core.on_evicted(meta, SEGMENT_TOKENS)
        leave.append(time.perf_counter() - start)
    return min(enter), min(leave)


def timed(repeat: int, fn: Callable[[], object]) -> tuple[float, object]:
    result: object = None

    def once() -> float:
        nonlocal result
        start = time.perf_counter()
        result = fn()
        return time.perf_counter() - start

    return best_of(repeat, once), result


def memory_bytes(build: Callable[[], object]) -> int:
    gc.collect()
    tracemalloc.start()
    kept = build()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del kept
    return current


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchors", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    n, repeat = args.anchors, args.repeat
    metas = [NodeMeta(AnchorKind.SEGMENT, f"seg-{i:07d}", True) for i in range(n)]

    with_enter, with_leave = transitions(metas, ResidencyLog, repeat)
    base_enter, base_leave = transitions(metas, NoLog, repeat)

    core = DartCore(protect=8)
    for meta in metas:
        core.on_assign(None, meta, SEGMENT_TOKENS)
    generation, held = core.residency.generation, core.residency.version
    for meta in metas[:50]:
        core.on_evicted(meta, SEGMENT_TOKENS)
    for i in range(50):
        core.on_assign(None, NodeMeta(AnchorKind.SEGMENT, f"new-{i}", True), SEGMENT_TOKENS)

    def encode(since: int | None) -> Callable[[], bytes]:
        return lambda: orjson.dumps(core.residency_summary(generation, since).as_dict())

    full_s, full_body = timed(repeat, encode(None))
    delta_s, delta_body = timed(repeat, encode(held))
    assert isinstance(full_body, bytes) and isinstance(delta_body, bytes)
    decode_full_s, _ = timed(repeat, lambda: ResidencySummary.from_json(full_body))
    decode_delta_s, decoded = timed(repeat, lambda: ResidencySummary.from_json(delta_body))
    assert isinstance(decoded, ResidencySummary) and len(decoded.resident + decoded.gone) == 100

    def resident_log() -> ResidencyLog:
        log = ResidencyLog()
        for i in range(n):
            log.record(f"seg-{i:07d}", True)
        return log

    def churned_log() -> ResidencyLog:
        log = resident_log()
        for i in range(10 * n):  # distinct segments arriving and leaving
            name = f"churn-{i:08d}"
            log.record(name, True)
            log.record(name, False)
        return log

    mem_resident = memory_bytes(resident_log)
    mem_churned = memory_bytes(churned_log)

    us = 1e6
    print(f"DART residency log, {n} anchors (segments of {SEGMENT_TOKENS} tokens)")
    print(f"{'measure':<44}{'with log':>14}{'without':>12}{'ratio':>8}")
    for label, with_s, base_s in (
        (f"{n} transitions 0 -> >0 (on_assign)", with_enter, base_enter),
        (f"{n} transitions >0 -> 0 (on_evicted)", with_leave, base_leave),
    ):
        print(f"{label:<44}{with_s * 1e3:>11.1f} ms{base_s * 1e3:>9.1f} ms{with_s / base_s:>7.2f}x")
    extra_ns = (with_enter + with_leave - base_enter - base_leave) / (2 * n) * 1e9
    print(f"{'added per transition':<44}{extra_ns:>11.0f} ns")
    print()
    print(f"{'summary':<44}{'RPC build+JSON':>14}{'bytes':>12}{'proxy decode':>14}")
    for label, build_s, body, decode_s in (
        (f"full, {n} resident", full_s, full_body, decode_full_s),
        ("delta of 100 changes (50 gone, 50 new)", delta_s, delta_body, decode_delta_s),
    ):
        print(f"{label:<44}{build_s * us:>11.0f} us{len(body):>12,}{decode_s * us:>11.0f} us")
    print()
    print(f"{'memory (tracemalloc, ids included)':<44}{'bytes':>14}{'per entry':>12}")
    print(f"{f'{n} resident, {n} changes':<44}{mem_resident:>14,}{mem_resident / n:>12.0f}")
    label = f"+ {10 * n} distinct gone (bound {DEFAULT_MAX_ENTRIES})"
    entries = n + DEFAULT_MAX_ENTRIES
    print(f"{label:<44}{mem_churned:>14,}{mem_churned / entries:>12.0f}")


if __name__ == "__main__":
    main()
