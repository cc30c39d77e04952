"""The scripted DART scenario of SPEC §3, shared by the DART core's tests on the
simulator's radix tree (`test_dart_core.py`) and on SGLang's own RadixCache
(`sglang/test_sglang_dart_scenario.py`).

A system head S (8 tokens, its own owner `system_owner("h")`), segments A-D (6 tokens
each), one private suffix per request (4 tokens each); requests S+A+pA ... S+D+pD.
Table P̂ = {A: 40, B: 10, C: 30, D: 20}. `random_requests` draws the differential
tests' requests (two heads, one to three segments, a short private suffix).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from prism_wire import system_owner

SYSTEM = list(range(1000, 1008))
SEGMENTS = {name: list(range(2000 + 10 * i, 2006 + 10 * i)) for i, name in enumerate("ABCD")}
PRIVATE = {name: list(range(3000 + 10 * i, 3004 + 10 * i)) for i, name in enumerate("ABCD")}
TABLE = {"A": 40.0, "B": 10.0, "C": 30.0, "D": 20.0}
HEAD = system_owner("h")  # the head S's owner


def anchors_for(
    segment_ids: list[str], private_len: int, system_len: int = 8, head: str | None = "h"
) -> list[dict]:
    """The wire anchors of a request: the head (`head` names it), then `segment_ids`
    in order, then a private suffix of `private_len` tokens."""
    out = [{"kind": "system", "segment_id": head, "offset": system_len}]
    offset = system_len
    for seg in segment_ids:
        offset += len(SEGMENTS[seg])
        out.append({"kind": "segment", "segment_id": seg, "offset": offset})
    out.append({"kind": "private", "segment_id": None, "offset": offset + private_len})
    return out


def random_requests(rng: random.Random, count: int) -> Iterator[tuple[str, list[int], list[dict]]]:
    """`count` requests (rid, tokens, anchors) drawn from `rng`."""
    systems = [list(range(100, 108)), list(range(110, 116))]
    for i in range(count):
        system = rng.choice(systems)
        segs = rng.sample(sorted(SEGMENTS), rng.randint(1, 3))
        private = [rng.randint(500, 504) for _ in range(rng.randint(2, 6))]
        tokens = system + [t for s in segs for t in SEGMENTS[s]] + private
        yield f"q{i}", tokens, anchors_for(segs, len(private), len(system))
