"""A flood of unique system prompts must not pin the KV pool.

The twin (`loadgen.twin.twin`) plays one trace through the proxy's real admission core and
`PrismPolicy` (which produce every pushed table P̂_t) and prism-sim's scheduler, radix
cache and DART, in modeled time, deterministically. The scenario is the issue's, scaled
down: a 12,000-token pool; a flood of requests at 1.75 req/s (Poisson), each with its own
~3,600-token system prompt (so ~190k flood tokens overflow the pool ~16 times over the
30 s); and a victim that re-reads the same 12 hinted documents (~2,900 tokens, one
fixed order) every modeled second.

The same trace runs under three backends:

* `lru`: the plugin's plain LRU order (no table);
* `dart`: this code: each head ranked by its own demand, F_t bounded by 25 % of the pool;
* `old rule`: unbounded protection of every system head, emulated through the same interfaces: every
  system anchor without an id (all heads share one owner, as `SYSTEM_OWNER` did), that
  owner on top of every table (as its +inf did), and no cap (protect_fraction 1).

The victim's hit ratio is taken over its reusable prefix (head + documents): a private
suffix is evicted first by DART by design, and two questions whose texts happen to
share their first tokens would otherwise count as reuse under LRU only.

Measured here (victim hit over the reusable prefix; the whole prompt in brackets):
lru 0.621 (0.619), dart 0.688 (0.685), old rule 0.310 (0.309); most resident tokens
in F_t at the start of an eviction pass: dart 1,958 (cap 3,000), old rule 11,966.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loadgen.twin.twin import Twin, TwinSetup
from loadgen.workloads.textgen import random_words
from loadgen.workloads.trace_format import Segment, Trace, TraceHeader, TraceRequest
from prism_proxy.admission.core import Wave
from prism_sim.request import SimRequest
from prism_tokens.tokenizer import load_tokenizer
from prism_wire import system_owner

CAPACITY_TOKENS = 12_000
DURATION_S = 30
FLOOD_PER_S = 1.75
FLOOD_WORDS = 3000  # ~3,600 tokens: the 16k-character prompts, about
DOC_WORDS = 200  # ~240 tokens each


def flood_trace(seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    body = " ".join(random_words(rng, FLOOD_WORDS))
    docs = tuple(Segment(f"doc-{i}", " ".join(random_words(rng, DOC_WORDS))) for i in range(12))
    requests = []
    arrival, number = float(rng.exponential(1 / FLOOD_PER_S)), 0
    while arrival < DURATION_S:
        # unique from its first token: no two flood heads share a prefix
        system = f"Flood prompt {number}. {body}"
        requests.append(TraceRequest(f"flood-{number}", arrival, system, (), "Go.", 4, True, False))
        arrival += float(rng.exponential(1 / FLOOD_PER_S))
        number += 1
    for second in range(DURATION_S):
        requests.append(
            TraceRequest(
                f"victim-{second}",
                second + 0.5,
                "Answer from the documents.",
                docs,
                f"Question {second}?",
                4,
                reorder=False,
                hot=True,
            )
        )
    requests.sort(key=lambda r: r.arrival)
    return Trace(TraceHeader("flood", {}, seed, len(requests), "builtin"), tuple(requests))


class OldRuleTwin(Twin):
    """The pre-issue-23 rule through the same interfaces: heads anchored without an id
    (one shared owner), that owner ranked above everything in each table, no cap."""

    def _submit(self, tracked: Any, sim: SimRequest) -> None:
        if sim.kv_hints is not None:
            for anchor in sim.kv_hints["actions"][0]["payload"]["anchors"]:
                if anchor["kind"] == "system":
                    anchor["segment_id"] = None
        super()._submit(tracked, sim)

    def _release(self, wave: Wave) -> None:
        if wave.released and wave.dispatch_priorities:
            wave.plan.dispatch_priorities[system_owner(None)] = 1e300  # finite "+inf"
        super()._release(wave)


def run(twin_class: type[Twin], eviction: str, fraction: float | None) -> tuple[Twin, int]:
    """Play the trace; returns the twin and the most resident tokens F_t held at the
    start of any eviction pass."""
    setup = TwinSetup(
        policy="prism",
        eviction=eviction,
        kv_capacity_tokens=CAPACITY_TOKENS,
        protect_fraction=fraction,
    )
    twin = twin_class(flood_trace(), setup, load_tokenizer("builtin"))
    most = 0
    core = twin.dart
    if core is not None:
        begin = core.begin_eviction

        def watched() -> None:
            nonlocal most
            begin()
            most = max(most, core.stats().protected_tokens)

        core.begin_eviction = watched  # type: ignore[method-assign]
    records = twin.run()
    assert all(r.success for r in records)
    return twin, most


def victim_hit(twin: Twin) -> tuple[float, float]:
    """(hit over the reusable prefix, hit over the whole prompt) of the victim's
    re-reads (its first read is necessarily cold)."""
    reused = reusable = cached = prompt = 0
    for rid, tracked in twin.tracked.items():
        if not rid.startswith("victim-") or rid == "victim-0":
            continue
        sim = tracked.sim
        assert sim is not None and sim.kv_hints is not None
        anchors = sim.kv_hints["actions"][0]["payload"]["anchors"]
        end = max(a["offset"] for a in anchors if a["kind"] != "private")
        reused += min(sim.cached_tokens, end)
        reusable += end
        cached += sim.cached_tokens
        prompt += len(sim.input_ids)
    return reused / reusable, cached / prompt


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[Twin, int]]:
    return {
        "lru": run(Twin, "lru", None),
        "dart": run(Twin, "dart", None),
        "old rule": run(OldRuleTwin, "dart", 1.0),
    }


def test_a_steady_client_keeps_at_least_its_lru_hit_ratio_under_a_flood(runs) -> None:
    hits = {name: victim_hit(twin) for name, (twin, _) in runs.items()}
    print({name: tuple(round(h, 4) for h in hit) for name, hit in hits.items()})
    # the flood did overflow the pool, and the victim lost reuse under plain LRU too
    assert runs["lru"][0].engine.cache.evicted_tokens_total > 10 * CAPACITY_TOKENS
    assert hits["lru"][0] < 0.9
    assert hits["dart"][0] >= hits["lru"][0]
    # the test has teeth: the old rule (every head protected) fell far below LRU
    assert hits["old rule"][0] < hits["lru"][0] - 0.2


def test_protected_tokens_stay_within_the_share_of_the_pool(runs) -> None:
    dart, most = runs["dart"]
    stats = dart.dart.stats()
    assert stats.capacity_tokens == CAPACITY_TOKENS
    assert stats.protect_cap_tokens == CAPACITY_TOKENS // 4
    _, old_most = runs["old rule"]
    print({"dart": most, "old rule": old_most})
    assert 0 < most <= CAPACITY_TOKENS // 4
    assert old_most > 0.9 * CAPACITY_TOKENS  # the unbounded rule pins the pool
