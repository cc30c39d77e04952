"""What continuations re-prefilled of their own history, and why
(`prism_proxy.admission.reprefill`): the rule on hand-made facts, DART's record of a
retained owner's losses, and the twin's accounting, whose parts add up to the history
the run re-prefilled, with a scenario for each cause."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from backend_plugin.dart.core import DartCore, RetainedLoss
from backend_plugin.dart.keys import NodeMeta
from loadgen.twin.session_twin import SessionFeatures, SessionTwin, simulate_sessions
from loadgen.twin.twin import TwinSetup
from loadgen.workloads.session_trace import SessionParams, build_session_trace
from prism_proxy.admission.reprefill import (
    Cause,
    Continuation,
    Pause,
    cause,
    reprefill_tokens,
)
from prism_proxy.admission.sessions import SessionParams as TableParams
from prism_tokens.tokenizer import load_tokenizer
from prism_wire import AnchorKind, Retention


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin")


# ---- the rule ---------------------------------------------------------------------------
KEPT = Pause("k", paused_at=10.0, ttl_s=5.0, retained=True)


@pytest.mark.parametrize(
    ("pause", "returned_at", "lost", "expected"),
    [
        (None, 12.0, RetainedLoss(), Cause.NEVER_RETAINED),  # not a known pause
        (replace(KEPT, retained=False), 12.0, RetainedLoss(in_cap_at=11.0), Cause.NEVER_RETAINED),
        (KEPT, 12.0, RetainedLoss(absent_at=10.0), Cause.LATE),
        (KEPT, 20.0, RetainedLoss(absent_at=20.0), Cause.EXPIRED),  # its own hold found nothing
        (KEPT, 12.0, RetainedLoss(in_cap_at=11.0), Cause.EVICTED_WHILE_RETAINED),
        (KEPT, 12.0, RetainedLoss(in_cap_at=12.5), Cause.EVICTED_WHILE_RETAINED),  # its hold
        (KEPT, 20.0, RetainedLoss(in_cap_at=14.0), Cause.EVICTED_WHILE_RETAINED),  # late too
        (KEPT, 12.0, RetainedLoss(in_cap_at=9.0), Cause.UNHELD),  # an earlier pause's loss
        (KEPT, 12.0, RetainedLoss(over_cap_at=11.0), Cause.OVER_CAP),
        (KEPT, 12.0, RetainedLoss(host_at=11.0), Cause.DROPPED_FROM_HOST),
        (KEPT, 20.0, RetainedLoss(host_at=14.0), Cause.DROPPED_FROM_HOST),  # before the TTL
        (KEPT, 12.0, RetainedLoss(host_at=9.0), Cause.UNHELD),  # an earlier pause's copy
        (KEPT, 12.0, RetainedLoss(in_cap_at=11.0, host_at=11.5), Cause.EVICTED_WHILE_RETAINED),
        (KEPT, 20.0, RetainedLoss(), Cause.EXPIRED),  # back after 10 s of a 5 s TTL
        (KEPT, 14.0, RetainedLoss(), Cause.UNHELD),
    ],
)
def test_each_continuation_has_exactly_one_cause(pause, returned_at, lost, expected) -> None:
    call = Continuation(1000, 400, pause, returned_at, returned_at + 1.0, *lost)
    assert cause(call) is expected
    counts = reprefill_tokens([call])
    assert counts[expected.value] == counts["total"] == 600
    assert counts["history"] == 1000 and counts["continuations"] == 1


def test_dart_records_what_became_of_a_retained_owner() -> None:
    """A retention applied to an owner with nothing resident is `absent_at`; the
    evictions the twin drives are recorded through the scenarios below."""
    now = [5.0]
    core = DartCore("dart", capacity_tokens=1000, clock=lambda: now[0])
    core.inbox.submit_retain(Retention({"gone": (1.0, 60.0, 100)}))
    core.apply_pending()
    assert core.retained_loss("gone") == RetainedLoss(absent_at=5.0)
    now[0] = 6.0  # the same entry again: no new absence (only a new entry is one)
    core.inbox.submit_retain(Retention({"gone": (2.0, 60.0, 100)}))
    core.apply_pending()
    assert core.retained_loss("gone") == RetainedLoss(absent_at=5.0)
    assert core.retained_loss("never") == RetainedLoss()


def test_dart_records_a_retained_owners_copy_dropped_by_the_host_tier() -> None:
    """A demotion to host is no loss; the host tier dropping the copy while the
    retention is live is (`host_at`); an owner without a live entry records nothing."""
    now = [5.0]
    core = DartCore("dart", capacity_tokens=1000, clock=lambda: now[0])
    core.use_host_tier()
    seg = NodeMeta(AnchorKind.SEGMENT, "kept")
    core.on_assign(None, seg, 10)
    core.inbox.submit_retain(Retention({"kept": (1.0, 60.0, 10)}))
    core.apply_pending()
    core.on_evicted(seg, 10, to_host=True)
    assert core.retained_loss("kept") == RetainedLoss()
    now[0] = 7.0
    core.on_host_evicted(seg, 10)
    assert core.retained_loss("kept") == RetainedLoss(host_at=7.0)
    core.on_host_evicted(NodeMeta(AnchorKind.SEGMENT, "other"), 10)
    core.on_host_evicted(None, 10)
    assert core.retained_loss("other") == RetainedLoss()


# ---- the twin -----------------------------------------------------------------------------
SMALL = SessionParams(num_sessions=30, session_rate=2.0, min_calls=4, max_calls=6,
                      output_median_tokens=400, tool_median_s=2.0, source="synthetic")  # fmt: skip
POOL = 15_000  # a pool the paused histories do not fit (they total several times it)
DART = TwinSetup(policy="prism", eviction="dart", kv_capacity_tokens=POOL)
RETAIN = SessionFeatures(detect=True, retain=True)


def measured_reprefill(sessions: list[dict[str, Any]]) -> int:
    """From the records alone: each continuation's previous prompt less what it found
    cached (at least 0)."""
    return sum(
        max(0, before["prompt_tokens"] - after["cached_tokens"])
        for record in sessions
        for before, after in zip(record["calls"], record["calls"][1:], strict=False)
        if after["prompt_tokens"] is not None
    )


def run(tokenizer, setup: TwinSetup, features: SessionFeatures | None, **core: Any) -> SessionTwin:
    trace = build_session_trace(SMALL, tokenizer, seed=4)
    twin = SessionTwin(trace, setup, tokenizer, features)
    for name, value in core.items():  # DART's own settings (`prism-sim`'s config)
        setattr(twin.retainer, name, value)
    twin.run()
    return twin


def by_cause(twin: SessionTwin) -> dict[str, int]:
    return reprefill_tokens(twin.continuations)


@pytest.mark.parametrize(
    ("setup", "features"),
    [(replace(DART, policy=None, eviction="lru"), None), (DART, RETAIN)],
    ids=["sglang-lru", "prism+sessions"],
)
def test_the_causes_add_up_to_the_history_the_run_re_prefilled(tokenizer, setup, features):
    trace = build_session_trace(SMALL, tokenizer, seed=4)
    out = simulate_sessions(trace, setup, tokenizer, features)
    counts = out["summary"]["reprefill_tokens"]
    assert counts["total"] == measured_reprefill(out["sessions"]) > 0
    assert sum(counts[c.value] for c in Cause) == counts["total"]
    assert counts["continuations"] == out["summary"]["calls"] - SMALL.num_sessions
    if features is None:  # nothing retained without the proxy: one cause
        assert counts[Cause.NEVER_RETAINED] == counts["total"]


def test_under_pressure_retained_histories_are_evicted_while_retained(tokenizer) -> None:
    counts = by_cause(run(tokenizer, DART, RETAIN))
    assert counts[Cause.EVICTED_WHILE_RETAINED] > 0


def test_a_ttl_shorter_than_the_tools_makes_histories_expire(tokenizer) -> None:
    """A 1 s TTL against tools of median 2 s: most pauses outlive their retention."""
    short = TableParams(min_ttl_s=1.0, max_ttl_s=1.0, default_ttl_s=1.0)
    counts = by_cause(run(tokenizer, DART, replace(RETAIN, params=short)))
    assert counts[Cause.EXPIRED] > 0


def test_a_table_that_knows_the_return_times_lets_no_history_expire(tokenizer) -> None:
    """The known-returns bound (`KnownReturns`): each pause is kept as long as its tool
    will run, so none outlives its retention, where the learned model's 0.9 quantile
    leaves some to expire; and its paused sessions rank by when they will be back."""
    params = TableParams(rank="predicted", max_ttl_s=3600.0)
    learned = run(tokenizer, DART, replace(RETAIN, params=params))
    assert by_cause(learned)[Cause.EXPIRED] > 0
    known = run(tokenizer, DART, replace(RETAIN, params=params, known_returns=True))
    assert by_cause(known)[Cause.EXPIRED] == 0 and known.table is not None
    assert known.table.returns is known.known
    assert known.table.continued == learned.table.continued > 0  # type: ignore[union-attr]
    for delay in (0.01, 2.0, 300.0):
        known.known.delay_s = delay  # type: ignore[union-attr]
        assert known.table.returns.predict("head", "tool") == pytest.approx(delay + 0.05)
        assert known.table.ttl("head", "tool") == pytest.approx(max(0.5, delay + 0.05))


def test_a_small_retention_cap_leaves_retained_histories_over_it(tokenizer) -> None:
    """R_t may hold a tenth of the pool, less than one history: the other entries rank
    with unretained segments. With the whole pool, only the paused histories beyond it
    are over the cap."""
    capped = by_cause(run(tokenizer, DART, RETAIN, retain_fraction=0.1))
    whole = by_cause(run(tokenizer, DART, RETAIN, retain_fraction=1.0))
    assert capped[Cause.OVER_CAP] > whole[Cause.OVER_CAP]


def test_a_slow_proxy_word_comes_after_the_engine_evicted_the_history(tokenizer) -> None:
    """With half a second between the engine and the proxy, the engine frees a finished
    call's path long before the proxy's retention of it arrives."""
    slow = by_cause(run(tokenizer, replace(DART, hop_s=0.5), RETAIN))
    assert slow[Cause.LATE] > 0


def test_what_retention_does_not_reach_is_past_the_key_or_lost_before_it(tokenizer) -> None:
    """`unheld`: retained in time and never evicted while held. What is missing is the
    generation prompt the template adds after the retained last message (a few tokens),
    or more where part of the key went in the hop before the retention arrived."""
    trace = build_session_trace(SMALL, tokenizer, seed=4)
    twin = SessionTwin(trace, DART, tokenizer, RETAIN)
    core = twin.retainer
    assert core is not None
    evicted: dict[str, list[float]] = {}
    on_evicted = core.on_evicted

    def spy(meta: Any, num_tokens: int, **how: Any) -> None:
        if meta is not None and meta.owner is not None:
            evicted.setdefault(meta.owner, []).append(core.clock())
        on_evicted(meta, num_tokens, **how)

    core.on_evicted = spy  # type: ignore[method-assign]
    twin.run()
    unheld = [c for c in twin.continuations if cause(c) is Cause.UNHELD and c.missing_tokens]
    assert any(c.missing_tokens <= 8 for c in unheld)
    for call in unheld:
        assert call.pause is not None
        if call.missing_tokens > 8:  # part of the key went in the hop before the pause
            before = call.pause.paused_at - DART.hop_s
            assert any(before <= t < call.pause.paused_at for t in evicted[call.pause.key])


def test_the_sessions_sweep_sets_the_pool_on_unique_kv_and_reports_the_causes(
    tokenizer, tmp_path
) -> None:
    """`prism-loadgen sessions` in small: the pool is the fraction of the unique live KV
    (less than that of the histories counted per session: sessions share their type's
    prefix), and every row and the report say what was re-prefilled and why."""
    from loadgen.experiments.session_sweep import Point, sweep

    base = replace(SMALL, num_sessions=12)
    rows = sweep(base, [Point(2.0, 1.0, 0.5)], ("sglang-lru", "prism+sessions"), tmp_path,
                 seed=4, jobs=1, log=lambda _: None)  # fmt: skip
    for row in rows:
        unique, per_session = row["live_unique_tokens"]["mean"], row["live_history_tokens"]["mean"]
        assert row["pool_tokens"] == int(0.5 * unique) and 0 < unique < per_session
        counts = row["summary"]["reprefill_tokens"]
        assert sum(counts[c.value] for c in Cause) == counts["total"] > 0
    report = (tmp_path / "report.md").read_text()
    assert "× live unique KV" in report
    # the older measure, to reproduce the runs made before it changed
    older = sweep(replace(base, pool_basis="histories"), [Point(2.0, 1.0, 0.5)],
                  ("sglang-lru",), tmp_path / "h", seed=4, jobs=1, log=lambda _: None)  # fmt: skip
    assert older[0]["pool_tokens"] == int(0.5 * older[0]["live_history_tokens"]["mean"])
    histories = f"{older[0]['live_history_tokens']['mean']:,.0f}"
    said = (tmp_path / "h" / "report.md").read_text()
    assert f"× live histories ({older[0]['pool_tokens']:,} of {histories} tokens" in said
    assert "| prism+sessions | " + f"{rows[1]['summary']['reprefill_tokens']['total']:,}" in report


def test_saved_calls_hold_each_call_with_the_engines_timeline(tokenizer, tmp_path) -> None:
    """`prism-loadgen sessions --save-calls` in small: one record per call, matched to
    the engine's timeline of the same request, and `loadgen.reports.call_gap` finds
    no difference between a run and itself and the tool's time between calls."""
    from loadgen.experiments.session_sweep import Point, sweep
    from loadgen.reports.call_gap import compare, load

    base = replace(SMALL, num_sessions=12)
    rows = sweep(base, [Point(2.0, 1.0, 0.5)], ("sglang-lru", "prism+sessions"), tmp_path,
                 seed=4, jobs=1, save_calls=True, log=lambda _: None)  # fmt: skip
    lru = load(tmp_path / "calls" / "sglang-lru-2-1-0.5.jsonl")
    assert len(lru) == rows[0]["summary"]["calls"] > 12
    assert "calls" not in rows[0] and "engine_records" not in rows[0]  # not in results.json
    for (sid, number), call in lru.items():
        engine = call["engine"]
        if call["error"] is not None:  # refused (over the pool): the engine never ran it
            assert engine is None and call["ttft_s"] is None
            continue
        assert engine["rid"] == f"{sid}-{number:02d}"
        assert engine["arrival_s"] <= engine["admitted_s"] <= engine["first_token_s"]
        assert engine["first_token_s"] <= engine["finish_s"]
        assert call["completion_tokens"] == engine["output_tokens"] > 0
        following = lru.get((sid, number + 1))
        if following is not None:  # sent once the tool has run
            assert following["sent"] - call["end"] >= call["tool_s"] - 1e-9
    itself = compare(lru, lru)
    assert itself and all(row["mean_difference"] == 0 for row in itself)
    paced = compare(lru, load(tmp_path / "calls" / "prism+sessions-2-1-0.5.jsonl"))
    tool_time = next(row for row in paced if row["component"] == "end -> next send s")
    assert tool_time["calls"] > 0 and abs(tool_time["mean_difference"]) < 1e-6


def test_a_pool_smaller_than_every_prompt_is_reported_not_a_crash(tmp_path) -> None:
    """Every call refused (each prompt over the pool): the sweep says so in its
    table ("–" where a run has no number, `0/6` completed) instead of failing."""
    from loadgen.experiments.session_sweep import Point, sweep

    base = replace(SMALL, num_sessions=6)
    rows = sweep(base, [Point(2.0, 1.0, 0.5)], ("sglang-lru", "prism+sessions"), tmp_path,
                 seed=4, jobs=1, log=lambda _: None)  # fmt: skip
    assert all(row["summary"]["p99_ttft_ms"] is None for row in rows)
    report = (tmp_path / "report.md").read_text()
    assert "| sglang-lru | – | – | – | – | – |" in report and "0/6 |" in report
