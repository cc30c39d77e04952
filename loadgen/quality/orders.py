"""The document orders the answer-quality run compares: pure functions.

* `fifo`: the client's order (the trace's, a shuffle), kept by the proxy's `fifo` policy;
* `fifo-rerun`: `fifo` again on a fresh engine: the run-to-run noise (batches form
  differently, and a CPU's batched kernels need not give bit-equal logits);
* `prism`: the same request, reordered by QAS in the proxy (`--policy prism`);
* `adversarial`: the answer-bearing passages moved to the middle of the context, the
  distractors at both ends in their client order. Chosen before any run as the position
  the "lost in the middle" study (Liu et al., TACL 2024) found worst for readers;
* `answer-first`, `answer-last`: the answer-bearing passages first / last (next to the
  question), for the position effect itself;
* `no-answer`: the answer-bearing passages removed (a floor: what the model gets without
  the evidence).

Every order but `prism` is applied by the client and sent through the `fifo` proxy, so
the engine sees exactly that order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from loadgen.workloads.trace_format import Segment, TraceRequest

ORDERS = (
    "fifo",
    "fifo-rerun",
    "prism",
    "adversarial",
    "answer-first",
    "answer-last",
    "no-answer",
)
PROXY_POLICY = {order: "prism" if order == "prism" else "fifo" for order in ORDERS}


def arrange(segments: Sequence[Segment], holders: Sequence[str], order: str) -> list[Segment]:
    """`segments` as the client sends them under `order`; `holders` are the ids of the
    passages that state the answer."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; expected one of {', '.join(ORDERS)}")
    if order in ("fifo", "fifo-rerun", "prism"):
        return list(segments)
    answer = [s for s in segments if s.id in holders]
    others = [s for s in segments if s.id not in holders]
    if order == "no-answer":
        return others
    if order == "answer-first":
        return answer + others
    if order == "answer-last":
        return others + answer
    start = (len(segments) - len(answer)) // 2
    return others[:start] + answer + others[start:]


def answer_positions(segments: Sequence[Segment], holders: Sequence[str]) -> list[int]:
    """1-based positions of the answer-bearing passages in `segments`."""
    return [number for number, s in enumerate(segments, 1) if s.id in holders]


def arranged_request(request: TraceRequest, order: str) -> TraceRequest:
    """A copy of `request` with its segments in the client order of `order`."""
    holders = request.meta.get("answer_segments") or []
    return replace(request, segments=tuple(arrange(request.segments, holders, order)))
