"""The sans-IO admission core and its pacing rule (SPEC §2, prefill pacing)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prism_proxy.admission.core import AdmissionCore, BackendLimits, PrefillPacing, QueueFullError
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.policies import POLICIES, make_policy
from prism_proxy.qas.types import QueuedRequest


def _core(
    policy: str = "fifo", batch: int = 2, backstop: int | None = None, window_s: float = 0.01
) -> AdmissionCore:
    return AdmissionCore(
        make_policy(policy, QasParams()),
        PrefillPacing(batch, backstop),
        window_s=window_s,
        max_queue=1000,
    )


def _arrive(core: AdmissionCore, rid: str, now: float, *segments: str) -> None:
    core.arrive(QueuedRequest(rid=rid, arrival=now, segments=segments), now)


def _released(core: AdmissionCore, now: float) -> list[str]:
    wave = core.run_round(now)
    return [] if wave is None else [r.rid for r in wave.released]


def test_decoding_requests_do_not_count_against_b() -> None:
    core = _core(batch=2)
    for i in range(4):
        _arrive(core, f"r{i}", float(i))
    assert _released(core, 10.0) == ["r0", "r1"]
    assert core.pending_prefill == 2 and core.room == 0
    assert _released(core, 11.0) == []
    core.first_token("r0")
    core.first_token("r1")
    # Both decode: two in flight, none pending, so a full wave of B again.
    assert core.inflight == 2 and core.room == 2
    assert _released(core, 12.0) == ["r2", "r3"]
    assert core.inflight == 4 and core.pending_prefill == 2


def test_abort_or_failure_frees_pending_at_once() -> None:
    core = _core(batch=1)
    _arrive(core, "a", 0.0)
    _arrive(core, "b", 0.1)
    assert _released(core, 1.0) == ["a"]
    assert core.next_round_at(1.5) is None  # nothing can go while "a" is pending
    core.finish("a")  # aborted before its first token
    assert core.pending_prefill == 0 and core.inflight == 0
    assert core.next_round_at(1.5) == 1.5  # the window since 1.0 has passed
    assert _released(core, 1.5) == ["b"]


def test_backstop_bounds_requests_in_flight() -> None:
    core = _core(batch=8, backstop=3)
    for i in range(6):
        _arrive(core, f"r{i}", float(i))
    assert _released(core, 10.0) == ["r0", "r1", "r2"]
    for rid in ("r0", "r1", "r2"):
        core.first_token(rid)
    assert core.room == 0  # nobody pending, but three decoding fill the backstop
    core.finish("r1")
    assert _released(core, 11.0) == ["r3"]


def test_round_timing_window_and_idle_backend() -> None:
    core = _core(batch=1, window_s=0.01)
    assert core.next_round_at(0.0) is None  # empty queue
    _arrive(core, "a", 0.0)
    assert core.next_round_at(0.0) == 0.0  # room and an empty queue: a round at once
    _arrive(core, "b", 0.0)
    assert _released(core, 0.0) == ["a"]
    core.first_token("a", 500)
    # "b" waited in a non-empty queue: its round comes one window after the last.
    assert core.next_round_at(0.001) == pytest.approx(0.01)
    assert core.next_round_at(0.5) == 0.5
    assert _released(core, 0.5) == ["b"]
    core.first_token("b")
    _arrive(core, "c", 0.501)  # an empty queue again, and room: at once
    assert core.next_round_at(0.501) == 0.501


def test_withdrawn_requests_are_skipped_at_commit() -> None:
    core = _core(batch=4)
    for rid in ("a", "b", "c"):
        _arrive(core, rid, 0.0)
    round_input = core.begin_round(0.0)
    assert round_input is not None and round_input.wave_size == 4
    plan = core.plan(round_input)
    assert core.withdraw("b")
    wave = core.commit(round_input, plan, 0.1)
    assert [r.rid for r in wave.released] == ["a", "c"]
    assert core.queue_depth == 0 and core.pending_prefill == 2


def test_queue_limit_and_close() -> None:
    core = AdmissionCore(make_policy("fifo"), PrefillPacing(1), window_s=0.0, max_queue=1)
    _arrive(core, "a", 0.0)
    with pytest.raises(QueueFullError):
        _arrive(core, "b", 0.0)
    assert core.close() == ["a"]
    assert core.queue_depth == 0


def test_pacing_rule_follows_the_backend_and_observed_uncached_tokens() -> None:
    pacing = PrefillPacing()
    # Nothing reported yet: an 8192-token budget over 1024 tokens per request.
    assert pacing.prefill_batch == 8 and pacing.backstop == 1024
    states = [{"effective_max_running_requests_per_dp": 48}]  # SGLang 0.5.23's field
    info = {"chunked_prefill_size": 4096, "max_running_requests": None, "internal_states": states}
    pacing.learn(BackendLimits.from_server_info(info))
    assert pacing.prefill_batch == 4 and pacing.backstop == 48
    for _ in range(200):  # the moving average converges on what the backend reports
        pacing.observe(256)
    assert pacing.prefill_batch == 16
    for _ in range(200):
        pacing.observe(1)
    assert pacing.prefill_batch == 48  # never above the backstop


def test_pacing_reads_chunking_off_and_server_arguments() -> None:
    # SGLang: chunked_prefill_size -1 disables chunking; max_prefill_tokens is the budget.
    info = {"chunked_prefill_size": -1, "max_prefill_tokens": 16384, "max_running_requests": 7}
    assert BackendLimits.from_server_info(info) == BackendLimits(16384, 7)
    assert BackendLimits.from_server_info({}) == BackendLimits(None, None)
    pacing = PrefillPacing(prefill_batch=5, max_inflight=9)
    pacing.learn(BackendLimits(100, 2))
    assert pacing.prefill_batch == 5 and pacing.backstop == 9  # flags win


def test_pacing_behind_a_gateway_counts_every_replica() -> None:
    """Three engines behind one gateway: the server info is one engine's, and B and the
    backstop count it three times; fixed flags still win."""
    states = [{"effective_max_running_requests_per_dp": 48}]
    limits = BackendLimits.from_server_info(
        {"chunked_prefill_size": 4096, "internal_states": states}
    )
    one, three = PrefillPacing(), PrefillPacing(replicas=3)
    for pacing in (one, three):
        pacing.learn(limits)
        for _ in range(200):
            pacing.observe(512)
    assert (one.prefill_batch, one.backstop) == (8, 48)
    assert (three.prefill_batch, three.backstop) == (24, 144)
    fixed = PrefillPacing(prefill_batch=5, max_inflight=9, replicas=3)
    fixed.learn(limits)
    assert (fixed.prefill_batch, fixed.backstop) == (5, 9)
    with pytest.raises(ValueError):
        PrefillPacing(replicas=0)


def test_backend_replicas_default_to_one_per_control_rpc() -> None:
    from prism_proxy.config import ProxyConfig

    assert ProxyConfig().replicas == 1
    urls = "http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3"
    assert ProxyConfig(control_url=urls).replicas == 3
    assert ProxyConfig(control_url=urls, backend_replicas=2).replicas == 2


class PacingMachine(RuleBasedStateMachine):
    """Random arrivals, rounds, first tokens, finishes and withdrawals, any policy:
    pending ≤ B, in flight ≤ backstop, every request in exactly one place."""

    def __init__(self) -> None:
        super().__init__()
        self.core: AdmissionCore | None = None
        self.now = 0.0
        self.next_id = 0
        self.queued: set[str] = set()
        self.pending: set[str] = set()
        self.decoding: set[str] = set()

    @precondition(lambda self: self.core is None)
    @rule(
        policy=st.sampled_from(sorted(POLICIES)),
        batch=st.integers(1, 5),
        backstop=st.integers(1, 8),
    )
    def start(self, policy: str, batch: int, backstop: int) -> None:
        self.core = _core(policy, batch=batch, backstop=backstop, window_s=0.0)

    @precondition(lambda self: self.core is not None)
    @rule(segments=st.lists(st.sampled_from("abcdef"), max_size=3, unique=True))
    def arrive(self, segments: list[str]) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.now += 0.001
        _arrive(self.core, rid, self.now, *segments)
        self.queued.add(rid)

    @precondition(lambda self: self.core is not None)
    @rule()
    def run_round(self) -> None:
        room = self.core.room
        released = _released(self.core, self.now)
        assert len(released) == min(room, len(self.queued))
        assert set(released) <= self.queued
        self.queued -= set(released)
        self.pending |= set(released)

    @precondition(lambda self: self.core is not None and self.pending)
    @rule(data=st.data())
    def first_token(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.pending)))
        self.core.first_token(rid, data.draw(st.integers(0, 2000)))
        self.pending.discard(rid)
        self.decoding.add(rid)

    @precondition(lambda self: self.core is not None and (self.pending or self.decoding))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.pending | self.decoding)))
        assert self.core.finish(rid)
        self.pending.discard(rid)
        self.decoding.discard(rid)

    @precondition(lambda self: self.core is not None and self.queued)
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.queued)))
        assert self.core.withdraw(rid)
        self.queued.discard(rid)

    @invariant()
    def limits_hold(self) -> None:
        if self.core is None:
            return
        pacing = self.core.pacing
        assert self.core.pending_prefill == len(self.pending) <= pacing.prefill_batch
        assert self.core.inflight == len(self.pending | self.decoding) <= pacing.backstop
        assert self.core.queue_depth == len(self.queued)


TestPacingMachine = PacingMachine.TestCase
TestPacingMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
