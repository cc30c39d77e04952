"""QAS beyond the paper: canonical ties, residency, the deadline lane; and
the system heads' entries in DART's table.

Pure policy and admission-core tests; the proxy end of it is in
`test_proxy_reorder_reuse.py`, DART's residency RPC in `test_dart_residency.py`.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_proxy.admission.core import AdmissionCore, PrefillPacing
from prism_proxy.qas.alignment import canonical_key
from prism_proxy.qas.counters import head_key
from prism_proxy.qas.params import QAS_VARIANTS, RESIDENCY_WEIGHT, QasParams, qas_params
from prism_proxy.qas.policies import make_policy
from prism_proxy.qas.prism import PrismPolicy
from prism_proxy.qas.residency import PendingResidency, ResidentSegments, ViewResidency
from prism_proxy.qas.types import ActiveRequest, Lane, QueuedRequest
from prism_wire import ResidencySummary

SEGMENTS = [f"doc-{i}" for i in range(10)]


# --- canonical tie-break -----------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=8, unique=True),
    st.randoms(use_true_random=False),
    st.integers(0, 4),
)
def test_same_set_in_any_order_gives_the_same_skeleton(segments, rng, f_front) -> None:
    shuffled = list(segments)
    rng.shuffle(shuffled)
    policy = PrismPolicy(qas_params("canonical", {"f_front": f_front}))
    one = policy.plan_round([QueuedRequest("a", 0.0, tuple(segments))], [], 1)
    two = policy.plan_round([QueuedRequest("b", 0.0, tuple(shuffled))], [], 1)
    assert one.skeletons["a"] == two.skeletons["b"]
    assert one.signatures["a"] == two.signatures["b"]
    # the global order, not either client's: sorted by the canonical key
    assert list(one.skeletons["a"]) == sorted(segments, key=canonical_key)


def test_paper_ties_keep_the_clients_order() -> None:
    policy = make_policy("prism", qas_params("paper"))
    order = ("doc-3", "doc-1", "doc-2", "doc-0")
    plan = policy.plan_round([QueuedRequest("a", 0.0, order)], [], 1)
    assert plan.skeletons["a"] == order


def test_canonical_ties_only_break_ties() -> None:
    """A segment with more demand still leads; canonical order only orders equals."""
    policy = PrismPolicy(qas_params("canonical", {"f_front": 1}))
    last = max(SEGMENTS[:4], key=canonical_key)  # the canonically last of four
    queue = [QueuedRequest("a", 0.0, tuple(SEGMENTS[:4]))]
    active = [ActiveRequest("x", (last,))]
    plan = policy.plan_round(queue, active, 1)
    rest = sorted((s for s in SEGMENTS[:4] if s != last), key=canonical_key)
    assert plan.skeletons["a"] == (last, *rest)


def test_non_reorderable_requests_are_never_reordered() -> None:
    policy = PrismPolicy(qas_params("full"))
    order = ("doc-9", "doc-8", "doc-7")
    plan = policy.plan_round([QueuedRequest("a", 0.0, order, reorder=False)], [], 1)
    assert plan.skeletons["a"] == order


# --- residency ---------------------------------------------------------------------------
def test_residency_weight_sits_between_next_batch_and_queued() -> None:
    params = qas_params("residency")
    assert params.w_g * 9_999 < RESIDENCY_WEIGHT == params.w_c < params.w_n


def test_resident_segments_lead_a_lone_request() -> None:
    residency = ResidentSegments()
    residency.apply(ResidencySummary("g1", 3, True, resident=("doc-7", "doc-5")))
    policy = PrismPolicy(qas_params("full", {"f_front": 1}), residency)
    order = ("doc-1", "doc-5", "doc-2", "doc-7")
    plan = policy.plan_round([QueuedRequest("a", 0.0, order)], [], 1)
    skeleton = plan.skeletons["a"]
    # both resident segments lead (the front widens past f_front = 1), canonically
    assert skeleton[:2] == tuple(sorted(("doc-5", "doc-7"), key=canonical_key))
    assert skeleton[2:] == tuple(sorted(("doc-1", "doc-2"), key=canonical_key))
    # residency ranks segments, but DART's table P̂_t leaves it out
    assert plan.priorities["doc-7"] == RESIDENCY_WEIGHT + 1
    assert plan.dispatch_priorities["doc-7"] == plan.dispatch_priorities["doc-1"]


def test_resident_segments_apply_full_and_delta_summaries() -> None:
    residency = ResidentSegments()
    residency.apply(ResidencySummary("g1", 5, True, resident=("a", "b", "c")))
    residency.apply(ResidencySummary("g1", 8, False, resident=("d",), gone=("a",)))
    assert residency.resident() == {"b", "c", "d"}
    assert (residency.generation, residency.version) == ("g1", 8)
    with pytest.raises(ValueError):  # a delta of a restarted DART is refused
        residency.apply(ResidencySummary("g2", 1, False, resident=("e",)))
    residency.apply(ResidencySummary("g2", 1, True, resident=("e",)))
    assert residency.resident() == {"e"}
    residency.clear()
    assert residency.resident() == frozenset() and residency.version is None


def test_view_residency_records_waves_and_forgets_what_it_prunes() -> None:
    """Without DART: what prism released is resident until the bounded view prunes it."""
    policy = PrismPolicy(qas_params("full", {"cache_view_tokens": 3}))
    assert isinstance(policy.residency, ViewResidency)
    assert policy.residency.view is policy.paths
    first = QueuedRequest("a", 0.0, ("x", "y"), prefix_key="sys", head_tokens=1)
    policy.plan_round([first], [], 1)
    assert policy.residency.resident() == {"x", "y"}
    second = QueuedRequest("b", 1.0, ("z",), prefix_key="sys", head_tokens=1)
    policy.plan_round([second], [], 1)  # 1 + 1 + 1 + 1 tokens > 3: the oldest leaf goes
    assert "z" in policy.residency.resident()
    assert policy.residency.resident() != {"x", "y", "z"}


def test_a_lone_request_follows_its_cached_path_while_it_is_resident() -> None:
    """The view says (b, a, c) went out in that order; DART says what is still held."""
    residency = ResidentSegments()
    policy = PrismPolicy(qas_params("full"), residency)
    first = QueuedRequest("a", 0.0, ("b", "a", "c"), prefix_key="sys", head_tokens=4)
    residency.apply(ResidencySummary("g", 1, True, resident=("a", "b", "c")))
    policy.plan_round([first], [], 1)  # all resident, no path yet: canonical order
    cached = policy.plan_round([first], [], 1)  # (the same request again)
    sent = cached.skeletons["a"]
    lone = QueuedRequest("b", 1.0, ("d", sent[2], sent[0], sent[1]), prefix_key="sys")
    plan = policy.plan_round([lone], [], 1)
    assert plan.skeletons["b"][:3] == sent  # the whole cached path first
    residency.apply(ResidencySummary("g", 2, False, gone=(sent[1],)))
    plan = policy.plan_round([lone], [], 1)
    assert plan.skeletons["b"][:1] == sent[:1]  # DART evicted the second: the path stops
    assert plan.skeletons["b"][1] != sent[1]
    other_head = QueuedRequest("c", 2.0, lone.segments, prefix_key="other-system")
    plan = policy.plan_round([other_head], [], 1)
    # no path under another head: the resident ones lead in canonical order
    assert plan.skeletons["c"][:2] == tuple(sorted((sent[0], sent[2]), key=canonical_key))


def test_paper_variant_ignores_residency() -> None:
    residency = ResidentSegments()
    residency.apply(ResidencySummary("g", 1, True, resident=("doc-2",)))
    policy = PrismPolicy(qas_params("paper"), residency)
    order = ("doc-1", "doc-2")
    assert policy.plan_round([QueuedRequest("a", 0.0, order)], [], 1).skeletons["a"] == order


# --- the deadline lane -------------------------------------------------------------------
def test_cold_quota_grows_with_late_requests_up_to_its_ceiling() -> None:
    params = QasParams(q_cold=2, cold_max_fraction=0.5)
    assert [params.cold_quota(8, late) for late in (0, 1, 2, 3, 4, 5, 9)] == [2, 2, 2, 3, 4, 4, 4]
    assert params.cold_quota(2, 9) == 2  # never below q_cold


@st.composite
def deadline_rounds(draw: st.DrawFn):
    size = draw(st.integers(1, 30))
    queue = []
    for i in range(size):
        arrival = float(draw(st.integers(0, 20)))
        slo = draw(st.one_of(st.none(), st.integers(1, 10)))
        deadline = arrival + (slo if slo is not None else 5.0)
        segments = tuple(draw(st.lists(st.sampled_from(SEGMENTS[:3]), max_size=2, unique=True)))
        queue.append(QueuedRequest(f"q{i:02d}", arrival, segments, deadline=deadline))
    return queue, draw(st.integers(1, 10)), float(draw(st.integers(0, 30)))


@settings(max_examples=200, deadline=None)
@given(deadline_rounds(), st.sampled_from(["deadline", "full"]))
def test_the_deadline_lane_never_passes_over_an_earlier_deadline(round_, variant) -> None:
    queue, wave_size, now = round_
    plan = PrismPolicy(qas_params(variant)).plan_round(queue, [], wave_size, now=now)
    by_rid = {q.rid: q for q in queue}
    index = {q.rid: i for i, q in enumerate(queue)}  # equal arrivals: queue order

    def due(q: QueuedRequest) -> tuple[float, float, int]:
        return (q.deadline, q.arrival, index[q.rid])

    released = {e.rid for e in plan.wave}
    late_left = [q for q in queue if q.deadline <= now and q.rid not in released]
    for entry in plan.wave:
        request = by_rid[entry.rid]
        if entry.lane is Lane.COLD and request.deadline <= now:
            # nothing left waiting was due earlier (equal deadlines: nothing older)
            assert all(due(q) > due(request) for q in late_left)
    late = sum(1 for q in queue if q.deadline <= now)
    params = qas_params(variant)
    assert len(plan.wave) == min(wave_size, len(queue))
    if late and len(queue) > wave_size:  # the lane took at least its quota of late ones
        taken = sum(1 for e in plan.wave if by_rid[e.rid].deadline <= now)
        assert taken >= min(late, params.cold_quota(wave_size, late), wave_size)


def test_with_one_target_an_old_request_is_never_passed_over() -> None:
    """Uniform `cold_deadline_ms`: the lane is oldest first, whatever the buckets want."""
    core = AdmissionCore(
        PrismPolicy(qas_params("deadline", {"cold_deadline_ms": 1000, "q_cold": 1})),
        PrefillPacing(4),
        window_s=0.0,
        max_queue=100,
        cold_deadline_s=1.0,
    )
    for i in range(12):  # hot requests keep arriving; one rare old one waits
        core.arrive(QueuedRequest(f"hot{i}", 0.1 * i, ("hot",)), 0.1 * i)
    core.arrive(QueuedRequest("rare", 0.05, ("rare",)), 0.05)
    wave = core.run_round(2.0)  # everyone is past 1 s; the rare one is among the oldest
    assert wave is not None
    released = [r.rid for r in wave.released]
    assert "rare" in released
    waiting = [rid for rid in (f"hot{i}" for i in range(12)) if rid not in released]
    assert all(core.is_queued(rid) for rid in waiting)


def test_admission_core_stamps_deadlines_from_slo_or_target() -> None:
    core = AdmissionCore(
        PrismPolicy(qas_params("deadline", {"cold_deadline_ms": 500})),
        PrefillPacing(1),
        window_s=0.0,
        max_queue=10,
        cold_deadline_s=qas_params("deadline", {"cold_deadline_ms": 500}).cold_deadline_s,
    )
    assert core.deadline_for(QueuedRequest("a", 10.0), 10.0) == pytest.approx(10.5)
    assert core.deadline_for(QueuedRequest("b", 10.0, ttft_slo_s=2.0), 10.0) == 12.0
    # the SLO leaves room for the observed release → first-token time
    core.arrive(QueuedRequest("c", 0.0), 0.0)
    core.run_round(0.0)
    core.first_token("c", 10, now=0.3)
    assert core.prefill_s == pytest.approx(0.3)
    assert core.deadline_for(QueuedRequest("d", 1.0, ttft_slo_s=2.0), 1.0) == pytest.approx(2.7)
    paper = AdmissionCore(
        PrismPolicy(qas_params("paper")),
        PrefillPacing(1),
        window_s=0.0,
        max_queue=10,
        cold_deadline_s=qas_params("paper").cold_deadline_s,
    )
    assert paper.deadline_for(QueuedRequest("e", 0.0), 0.0) == math.inf


def test_every_variant_builds() -> None:
    for name in QAS_VARIANTS:
        assert isinstance(make_policy("prism", qas_params(name)), PrismPolicy)
    with pytest.raises(ValueError, match="unknown QAS variant"):
        qas_params("nope")


# --- system heads in DART's table ---------------------------------------------
def test_system_heads_earn_their_table_entry_by_demand() -> None:
    """A head's P̂_t counts the requests carrying it exactly as a segment's does.

    Wave size 1 with q_cold = 2: the cold lane takes the oldest, "a", so B = {a}.
    h1: a_t = 1 (x), n_t = 1 (a), g_t = 2 (a, b)  -> 1e6 + 1e5 + 2
    h2: g_t = 1 (c)                               -> 1
    d1: n_t = 1, g_t = 2 (a, c)                   -> 1e5 + 2
    """
    queue = [
        QueuedRequest("a", 0.0, ("d1",), prefix_key="h1", head_tokens=5),
        QueuedRequest("b", 1.0, ("d2",), prefix_key="h1", head_tokens=5),
        QueuedRequest("c", 2.0, ("d1",), prefix_key="h2", head_tokens=5),
        QueuedRequest("p", 3.0),  # an unhinted request: no head
        QueuedRequest("e", 4.0, ("d2",), prefix_key="empty", head_tokens=0),  # empty head
    ]
    active = [ActiveRequest("x", ("d3",), "h1")]
    plan = PrismPolicy(QasParams()).plan_round(queue, active, 1)
    assert [e.rid for e in plan.wave] == ["a"]
    assert plan.dispatch_priorities == {
        "d1": 100_002.0,
        "d2": 2.0,
        "d3": 1_000_000.0,
        head_key("h1"): 1_100_002.0,
        head_key("h2"): 1.0,
    }
    assert set(plan.priorities) == {"d1", "d2", "d3"}  # heads rank no segment
    assert head_key("h1").startswith("\x00")  # a namespace no segment id can enter


def test_pending_residency_counts_released_segments_until_dart_reports_or_grace_ends():
    """DART reports a poll after a released request is cached: meanwhile, what the proxy
    released counts as resident, until DART reports it (then DART's word), or for
    `grace_s` at most (a segment DART never reports drops out)."""
    now = [0.0]
    dart = ResidentSegments()
    residency = PendingResidency(dart, grace_s=5.0, clock=lambda: now[0])
    policy = PrismPolicy(qas_params("full"), residency)
    queue = [QueuedRequest("r1", 0.0, ("a", "b"), True, segment_tokens=(10, 10))]
    policy.plan_round(queue, [], wave_size=4)
    assert residency.resident() == {"a", "b"}  # released, not reported yet
    dart.apply(ResidencySummary("g", 1, True, ("a",)))
    now[0] = 4.0
    assert residency.resident() == {"a", "b"}
    now[0] = 5.5  # b's grace is over and DART never reported it
    assert residency.resident() == {"a"}
    dart.apply(ResidencySummary("g", 2, False, (), ("a",)))  # evicted: DART's word holds
    assert residency.resident() == frozenset()
    # a request right behind a released one, before DART reports anything, follows the
    # released one's path, not the canonical order it would take with nothing resident
    path = tuple(sorted(("x", "y", "z"), key=canonical_key, reverse=True))
    first = QueuedRequest("r2", 6.0, path, False, segment_tokens=(5, 5, 5))  # client's order
    policy.plan_round([first], [], wave_size=4)
    follow = QueuedRequest("r3", 6.1, path[::-1], True, segment_tokens=(5, 5, 5))
    assert policy.plan_round([follow], [], wave_size=4).skeletons["r3"] == path
    alone = PrismPolicy(qas_params("full"), PendingResidency(ResidentSegments()))
    assert alone.plan_round([follow], [], wave_size=4).skeletons["r3"] == path[::-1]


def test_the_clients_grouping_hint_buckets_requests_with_nothing_found():
    """`prompt_cache_key` (QueuedRequest.group): requests with no segments share a bucket
    when they share the key, so they go out together in the hot lane; without a key they
    stay cold-only; a request with segments keeps its own signature."""
    policy = PrismPolicy(qas_params("full"))
    queue = [
        QueuedRequest("a1", 0.0, group="tenant-a"),
        QueuedRequest("b1", 0.1, group="tenant-b"),
        QueuedRequest("a2", 0.2, group="tenant-a"),
        QueuedRequest("none", 0.3),
        QueuedRequest("seg", 0.4, ("d1",), group="tenant-a", segment_tokens=(10,)),
    ]
    plan = policy.plan_round(queue, [], 8)
    buckets = {tuple(b.rids) for b in plan.buckets}
    assert ("a1", "a2") in buckets and ("b1",) in buckets and ("seg",) in buckets
    assert all("none" not in rids for rids in buckets)
    assert plan.signatures["seg"] == ("d1",) and plan.signatures["none"] == ()
    lanes = {entry.rid: entry.lane for entry in plan.wave}
    assert lanes["a1"] == lanes["a2"] == Lane.HOT and lanes["none"] == Lane.COLD
    assert not any(key.startswith("\x00group:") for key in plan.dispatch_priorities)
