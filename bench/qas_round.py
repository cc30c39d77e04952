"""Time one QAS round at growing queue sizes: the cost must be O(S) (SPEC §2, cost).

    python -m bench.qas_round [--sizes 1000,10000,100000] [--repeat 5] [--qas paper,full]

S is the number of queued segment occurrences. The queue mimics zipf_hotspot (k = 5,
70% hot requests over a 20-passage hot set, 981 passages). Prints the best time of
`--repeat` rounds per size and the time per occurrence; a flat per-occurrence column
means linear growth. The last column is each size's per-occurrence time relative to the
smallest size. With residency on (`--qas full`), every queued request's path was
dispatched once before and every segment is resident: the cached-path search's worst
case, since each request finds a path to follow.
"""

from __future__ import annotations

import argparse
import random
import time

from prism_proxy.qas.params import QAS_VARIANTS, qas_params
from prism_proxy.qas.prism import PrismPolicy
from prism_proxy.qas.residency import ResidentSegments
from prism_proxy.qas.types import ActiveRequest, QueuedRequest
from prism_wire import ResidencySummary

SEGMENTS_PER_REQUEST = 5


def make_queue(occurrences: int, seed: int = 0) -> list[QueuedRequest]:
    rng = random.Random(seed)
    hot = [f"hot{i}" for i in range(20)]
    weights = [1 / (rank + 1) ** 1.2 for rank in range(len(hot))]
    queue = []
    for i in range(occurrences // SEGMENTS_PER_REQUEST):
        segments: set[str] = set()
        if rng.random() < 0.7:
            segments.add(rng.choices(hot, weights)[0])
        while len(segments) < SEGMENTS_PER_REQUEST:
            segments.add(f"cold{rng.randrange(961)}")
        ordered = sorted(segments)
        rng.shuffle(ordered)
        queue.append(QueuedRequest(f"r{i}", i * 1e-3, tuple(ordered)))
    return queue


def make_policy(variant: str, queue: list[QueuedRequest]) -> PrismPolicy:
    """A prism policy of `variant`; with residency, every path dispatched and resident."""
    params = qas_params(variant, {"cache_view_tokens": 10**9})
    resident = ResidentSegments()
    policy = PrismPolicy(params, resident)
    if policy.paths is not None:
        for request in queue:
            policy.paths.insert(request, request.segments)
        everything = tuple({s for request in queue for s in request.segments})
        resident.apply(ResidencySummary("bench", 1, True, resident=everything))
    return policy


def time_round(queue: list[QueuedRequest], repeat: int, wave_size: int, variant: str) -> float:
    active = [ActiveRequest(f"a{i}", q.segments) for i, q in enumerate(queue[:wave_size])]
    best = float("inf")
    policy = make_policy(variant, queue)
    for _ in range(repeat):
        start = time.perf_counter()
        policy.plan_round(queue, active, wave_size, now=0.0)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--wave-size", type=int, default=64)
    parser.add_argument("--qas", default="paper,full", help=f"from {','.join(QAS_VARIANTS)}")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    variants = args.qas.split(",")
    print(
        f"{'qas':>10} {'S (occurrences)':>16} {'requests':>9} {'round ms':>10} {'ns/occ':>8}"
        f" {'ratio':>6}"
    )
    for variant in variants:
        baseline = None
        for size in sizes:
            queue = make_queue(size)
            seconds = time_round(queue, args.repeat, args.wave_size, variant)
            per_occurrence = seconds / size * 1e9
            baseline = baseline or per_occurrence
            print(
                f"{variant:>10} {size:>16,} {len(queue):>9,} {seconds * 1e3:>10.2f}"
                f" {per_occurrence:>8.0f} {per_occurrence / baseline:>6.2f}"
            )


if __name__ == "__main__":
    main()
