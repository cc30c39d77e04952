"""reorder_replay: the same documents again, in a new order.

What a RAG retriever does all day: a later question retrieves a set of passages that an
earlier one already retrieved, and returns them in another order. Each request either
draws ``k`` distinct passages uniformly from a pool of ``passages`` (a new set), or, with
probability ``r_repeat`` once a set exists, takes an earlier request's set (uniformly
among the earlier requests) in a fresh random order. No hot set: reuse comes only from
repeats. Arrivals are Poisson at ``qps`` (light by default: most production hours are
not peak hours). All requests share one system prompt; each has its own question.

A policy that keeps the client's order reuses the system prompt and whatever prefix the
shuffle happens to keep; the clairvoyant bound (`loadgen.workloads.bounds`, ordering ``greedy``)
reuses every passage of a repeat.
"""

from __future__ import annotations

from dataclasses import asdict

from loadgen.workloads.corpus import synthetic_passages
from loadgen.workloads.sampling import poisson_arrivals, sample_distinct, stream
from loadgen.workloads.textgen import TokenCounter, random_text
from loadgen.workloads.trace_format import Segment, TraceHeader, TraceRequest
from loadgen.workloads.trace_params import ReorderTraceParams

WORKLOAD = "reorder_replay"


def build_reorder_trace(
    params: ReorderTraceParams, seed: int, tokenizer: TokenCounter, tokenizer_name: str = "builtin"
) -> tuple[TraceHeader, list[TraceRequest]]:
    """The header and the requests of one reorder_replay trace (deterministic in ``seed``)."""
    text_rng = stream(seed, "text")
    pool = synthetic_passages(tokenizer, text_rng, params.passages, params.chunk_tokens)
    choice_rng = stream(seed, "passages")
    system = random_text(tokenizer, text_rng, params.system_tokens)
    arrivals = poisson_arrivals(stream(seed, "arrivals"), params.num_requests, params.qps)
    sets: list[list[int]] = []
    requests: list[TraceRequest] = []
    for number, arrival in enumerate(arrivals):
        repeat = bool(sets) and bool(choice_rng.random() < params.r_repeat)
        if repeat:
            chosen = list(sets[int(choice_rng.integers(len(sets)))])
        else:
            chosen = sample_distinct(choice_rng, list(range(len(pool))), params.k)
        sets.append(chosen)
        ordered = [chosen[int(i)] for i in choice_rng.permutation(len(chosen))]
        question = random_text(tokenizer, text_rng, params.question_tokens)
        requests.append(
            TraceRequest(
                rid=f"r{number:06d}",
                arrival=arrival,
                system=system,
                segments=tuple(Segment(f"p{i:05d}", pool[i]) for i in ordered),
                suffix=f"Question: {question}",
                max_tokens=params.max_tokens,
                reorder=True,
                hot=repeat,
                meta={"repeat": repeat},
            )
        )
    header = TraceHeader(
        workload=WORKLOAD,
        params={**asdict(params), "pool_size": len(pool)},
        seed=seed,
        num_requests=len(requests),
        tokenizer=tokenizer_name,
    )
    return header, requests
