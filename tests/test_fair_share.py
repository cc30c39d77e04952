"""The fair share of admission between accounts (issue 36): the pure split of a wave
(`admission.fair_share`) and the admission core that applies it."""

from __future__ import annotations

import pytest

from prism_proxy.admission.core import AdmissionCore, PrefillPacing
from prism_proxy.admission.fair_share import plan_shared, share_wave
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.policies import POLICIES, make_policy
from prism_proxy.qas.types import QueuedRequest


@pytest.mark.parametrize(
    ("waiting", "weights", "wave_size", "slots"),
    [
        # equal weights, both backlogged: half each
        ({"a": 10, "b": 10}, {}, 4, {"a": 2, "b": 2}),
        # a asks for less than its share: b takes the rest (max-min, nothing idles)
        ({"a": 1, "b": 10}, {}, 4, {"a": 1, "b": 3}),
        # weights 1:3 of 4 slots: 1 and 3
        ({"a": 10, "b": 10}, {"b": 3.0}, 4, {"a": 1, "b": 3}),
        # fewer waiting than the wave: everyone goes
        ({"a": 1, "b": 2}, {}, 8, {"a": 1, "b": 2}),
        # one slot, a tie: the account waiting longest (first in `waiting`) takes it
        ({"b": 5, "a": 5}, {}, 1, {"b": 1}),
        # one account: the whole wave
        ({"a": 10}, {}, 3, {"a": 3}),
    ],
)
def test_share_wave_splits_by_weight_and_demand(
    waiting: dict[str, int], weights: dict[str, float], wave_size: int, slots: dict[str, int]
) -> None:
    assert share_wave(waiting, weights, wave_size, {}).slots == slots


def test_credit_carries_a_fraction_across_rounds() -> None:
    """Waves of one slot, weights 1:3, both backlogged: over 20 rounds 5 and 15 (each
    round earns 0.25 and 0.75; the credit carried makes up what one slot cannot split)."""
    credit: dict[str, float] = {}
    total = {"a": 0, "b": 0}
    for _ in range(20):
        shares = share_wave({"a": 100, "b": 100}, {"a": 1.0, "b": 3.0}, 1, credit)
        credit = shares.credit
        for account, count in shares.slots.items():
            total[account] += count
        assert all(-1.0 <= c <= 1.0 for c in credit.values())
    assert total == {"a": 5, "b": 15}


def test_using_idle_slots_is_not_owed_later() -> None:
    """b took a's unused slots for many rounds; when a floods, b still gets half at once
    (its debt is bounded by one request)."""
    credit: dict[str, float] = {}
    for _ in range(50):
        credit = share_wave({"a": 1, "b": 100}, {}, 8, credit).credit
    assert credit["b"] >= -1.0
    assert share_wave({"a": 100, "b": 100}, {}, 8, credit).slots["b"] >= 3


def test_an_emptied_account_keeps_no_credit() -> None:
    credit = share_wave({"a": 1, "b": 100}, {}, 1, {}).credit  # a emptied, b owed 0.5
    assert credit == {"b": 0.5}
    assert share_wave({"a": 1}, {}, 1, credit).credit == {}


def _q(rid: str, account: str, arrival: float, *segments: str) -> QueuedRequest:
    return QueuedRequest(rid=rid, arrival=arrival, segments=segments, account=account)


def test_plan_shared_lets_the_policy_choose_within_each_share() -> None:
    """fifo within each account; the accounts' picks interleaved in release order."""
    queue = [
        _q("f1", "flood", 0.0),
        _q("f2", "flood", 1.0),
        _q("f3", "flood", 2.0),
        _q("s1", "steady", 3.0),
        _q("s2", "steady", 4.0),
    ]
    plan = plan_shared(make_policy("fifo"), queue, [], {"flood": 2, "steady": 1}, now=5.0)
    assert [e.rid for e in plan.wave] == ["f1", "s1", "f2"]


def _core(share_accounts: bool, weight: dict[str, float] | None = None) -> AdmissionCore:
    return AdmissionCore(
        make_policy("fifo", QasParams()),
        PrefillPacing(prefill_batch=2, max_inflight=2),
        window_s=0.01,
        max_queue=1000,
        share_accounts=share_accounts,
        account_weight=(lambda a: (weight or {}).get(a, 1.0)),
    )


@pytest.mark.parametrize("share_accounts", [True, False])
def test_core_releases_the_steady_account_beside_a_backlog(share_accounts: bool) -> None:
    """A flood of 10 queued before one steady request, two slots: with the fair share
    the steady request goes in the first wave; without it, after the whole flood."""
    core = _core(share_accounts)
    for i in range(10):
        core.arrive(_q(f"f{i}", "flood", float(i)), float(i))
    core.arrive(_q("s", "steady", 10.0), 10.0)
    order: list[str] = []
    now = 11.0
    while core.queue_depth:
        wave = core.run_round(now)
        assert wave is not None
        for released in wave.released:
            order.append(released.rid)
            core.finish(released.rid)
        now += 1.0
    position = order.index("s")
    assert position == (1 if share_accounts else 10)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_one_account_plans_exactly_as_without_accounts(policy: str) -> None:
    """Every request of one account: the same waves, in the same order, as the core with
    the fair share off (the twin's results depend on it)."""
    waves = []
    for share_accounts in (True, False):
        core = AdmissionCore(
            make_policy(policy, QasParams()),
            PrefillPacing(prefill_batch=3, max_inflight=4),
            window_s=0.01,
            max_queue=1000,
            share_accounts=share_accounts,
        )
        for i in range(12):
            segments = (f"d{i % 3}", f"d{(i + 1) % 4}")
            core.arrive(_q(f"r{i}", "only", float(i), *segments), float(i))
        released = []
        now = 20.0
        while core.queue_depth:
            wave = core.run_round(now)
            assert wave is not None
            released.append([(r.rid, r.lane, r.skeleton) for r in wave.released])
            for r in wave.released:
                core.finish(r.rid)
            now += 1.0
        waves.append(released)
    assert waves[0] == waves[1]
