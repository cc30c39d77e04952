"""DART orders the host tier too (`PRISM_DART_HOST_ORDER`, docs/dart-plugin.md): a node
demoted from the device keeps its owner for the host tier, whose eviction then drops
what DART would drop first and keeps what it retains; "lru" keeps the host tier's own
least-recently-used order. On prism-sim's host tier (`prism_sim.host_tier`) with the
DART extension, as the engine wires them; SGLang's unified tree is tested in
tests/sglang/test_sglang_dart_unified.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from dart_scenario import PRIVATE, SEGMENTS, SYSTEM, anchors_for

from backend_plugin.config import load_config
from backend_plugin.dart import DartCore, DartStrategy
from backend_plugin.dart.core import RetainedLoss
from backend_plugin.dart.tree import HOST_META_ATTR, carry_owner
from backend_plugin.sim_extension import DartSimExtension
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.eviction import LRUStrategy
from prism_sim.host_tier import HostTier, HostTierConfig, _resident_len
from prism_sim.radix_cache import RadixCache
from prism_sim.request import SimRequest
from prism_wire import Retention, make_kv_hints


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tokens_of(name: str) -> list[int]:
    return SYSTEM + SEGMENTS[name] + PRIVATE[name]


Tiers = tuple[RadixCache, HostTier, DartSimExtension, Clock]


def tiers(host_order: str, host_tokens: int) -> Tiers:
    clock = Clock()
    ext = DartSimExtension(DartCore("dart", protect=2, host_order=host_order))
    device = RadixCache(ext.strategy, clock=clock)
    ext.attach(device)
    host = HostTier(HostTierConfig(host_tokens, 1000, 1e6), device)
    ext.attach_host(host.host)
    return device, host, ext, clock


def serve(device: RadixCache, host: HostTier, ext: DartSimExtension, rid: str, tokens) -> None:
    """What the scheduler does with a request's tokens: insert, back up, annotate."""
    device.insert(tokens)
    host.backup(tokens)
    hints = make_kv_hints(anchors_for([rid], len(PRIVATE[rid])), message_id=rid)
    ext.on_insert(SimRequest(rid, tokens, 1, 0.0, kv_hints=hints), device, tokens)


@pytest.mark.parametrize("host_order", ["dart", "lru"])
def test_the_host_tier_drops_in_darts_order_or_its_own(host_order: str) -> None:
    """A is served first and retained, B later and not: once both left the device, host
    pressure drops B's copy under DART's order (its private suffixes first) and A's, the
    older, under LRU."""
    device, host, ext, clock = tiers(host_order, host_tokens=28)  # S + A + pA + B + pB
    for name in "AB":
        clock.now += 1
        serve(device, host, ext, name, tokens_of(name))
    ext.core.inbox.submit_retain(Retention({"A": (1.0, 60.0, None)}))
    clock.now += 1
    assert device.evict(10**6).num_tokens_evicted == 28  # every node left the device
    assert ext.core.stats().host_demoted_tokens == 28  # each with its copy on host
    assert ext.core.stats().as_dict()["host_order"] == host_order

    clock.now += 1
    fresh = list(range(5000, 5010))
    device.insert(fresh)  # on the device, so host eviction skips its copy
    host.backup(fresh)  # 10 tokens over the host pool
    kept = {name: _resident_len(host.host, tokens_of(name)) for name in "AB"}
    if host_order == "dart":
        # pA and pB (private) go first, then B (unretained); A, retained, stays
        assert kept == {"A": 14, "B": 8}
    else:
        # least recently used first: A's suffix and segment, the older ones
        assert kept == {"A": 8, "B": 18}
    assert host.host_evicted_tokens_total == (14 if host_order == "dart" else 10)


def test_a_retained_history_dropped_by_the_host_tier_is_recorded_lost() -> None:
    """Demoted while retained: no loss. Dropped from host while retained: lost there
    (`RetainedLoss.host_at`, the re-prefill cause `dropped_from_host`)."""
    device, host, ext, clock = tiers("dart", host_tokens=18)  # S + A + pA
    clock.now += 1
    serve(device, host, ext, "A", tokens_of("A"))
    ext.core.inbox.submit_retain(Retention({"A": (1.0, 60.0, None)}))
    clock.now += 1
    device.evict(10**6)
    assert ext.core.retained_loss("A") == RetainedLoss()  # demoted: no loss
    clock.now += 1
    fresh = list(range(5000, 5018))
    device.insert(fresh)
    host.backup(fresh)  # the whole host pool is needed: A's copy goes
    assert _resident_len(host.host, tokens_of("A")) == 0
    assert ext.core.retained_loss("A").host_at == clock.now


def test_a_host_copy_keeps_its_owner_across_the_host_trees_splits() -> None:
    device, host, ext, _ = tiers("dart", host_tokens=100)
    serve(device, host, ext, "A", tokens_of("A"))
    device.evict(10**6)
    upper = host.host.split_at(tokens_of("A"), len(SYSTEM) + 2)  # inside A's segment
    assert getattr(upper, HOST_META_ATTR).owner == "A"
    assert getattr(upper, HOST_META_ATTR).is_anchor is False
    node_a = host.host.walk(tokens_of("A"))[-2][0]
    assert getattr(node_a, HOST_META_ATTR).is_anchor is True

    lower, top = SimpleNamespace(), SimpleNamespace()
    setattr(lower, HOST_META_ATTR, getattr(node_a, HOST_META_ATTR))
    carry_owner(lower, top)  # the tree's own splits (SGLang's unified tree too)
    assert getattr(top, HOST_META_ATTR).owner == "A"


def test_the_engine_wires_the_host_tier_to_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = SimEngine(SimConfig(eviction="dart", enable_hierarchical_cache=True))
    assert isinstance(engine.scheduler.host_tier.host.strategy, DartStrategy)
    assert engine.scheduler.host_tier.host.strategy is engine.cache.strategy
    monkeypatch.setenv("PRISM_DART_HOST_ORDER", "lru")
    engine = SimEngine(SimConfig(eviction="dart", enable_hierarchical_cache=True))
    assert isinstance(engine.scheduler.host_tier.host.strategy, LRUStrategy)
    assert engine.extension.core.stats().host_demoted_tokens == 0  # counted apart all the same
    lru = SimEngine(SimConfig(eviction="lru", enable_hierarchical_cache=True))
    assert isinstance(lru.scheduler.host_tier.host.strategy, LRUStrategy)


def test_the_setting_is_checked() -> None:
    assert load_config({}).host_order == "dart"
    assert load_config({"PRISM_DART_HOST_ORDER": "lru"}).host_order == "lru"
    with pytest.raises(ValueError, match="PRISM_DART_HOST_ORDER"):
        load_config({"PRISM_DART_HOST_ORDER": "fifo"})
    with pytest.raises(ValueError, match="host_order"):
        DartCore("dart", host_order="fifo")
