"""zipf_hotspot: the paper's main RAG trace, exactly as SPEC §6 states it.

A pool of ``P`` passages (seeded filler of ``chunk_tokens`` tokens, or a user's corpus);
a hot set of ``hot_set`` passages chosen from the pool by the seed, ranked 1…|R_hot|.
Each request is hot with probability ``r_hot``: ``hot_count`` hot passages (default 4;
``-1``: uniform in 1…k per request) drawn by Zipf(``alpha``) over the hot ranks without
repeats; its other slots hold distinct cold passages drawn uniformly. A cold request
holds ``k`` cold passages. The ``k`` passages are shuffled. Arrivals are Poisson at
``qps``. All requests share one system prompt; each has its own question.

Arrival times, passage choice and text come from separate seeded streams, so traces
at different QPS hold the same prompts in the same order.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from loadgen.workloads.corpus import load_corpus, synthetic_passages
from loadgen.workloads.sampling import (
    draw_without_repeats,
    poisson_arrivals,
    sample_distinct,
    stream,
    zipf_weights,
)
from loadgen.workloads.textgen import TokenCounter, random_text
from loadgen.workloads.trace_format import Segment, TraceHeader, TraceRequest
from loadgen.workloads.trace_params import RagTraceParams

WORKLOAD = "zipf_hotspot"


def passage_id(index: int) -> str:
    return f"p{index:05d}"


def build_rag_trace(
    params: RagTraceParams, seed: int, tokenizer: TokenCounter, tokenizer_name: str = "builtin"
) -> tuple[TraceHeader, list[TraceRequest]]:
    """The header and the requests of one zipf_hotspot trace (deterministic in ``seed``)."""
    text_rng = stream(seed, "text")
    if params.corpus:
        pool = load_corpus(tokenizer, Path(params.corpus), params.chunk_tokens, params.passages)
    else:
        pool = synthetic_passages(tokenizer, text_rng, params.passages, params.chunk_tokens)
    if len(pool) - params.hot_set < params.k:
        raise ValueError(f"the pool holds {len(pool)} passages: too few for hot_set and k")

    choice_rng = stream(seed, "passages")
    order = choice_rng.permutation(len(pool)).tolist()
    hot_ids = order[: params.hot_set]  # hot_ids[0] is rank 1
    cold_ids = sorted(order[params.hot_set :])
    rank = {passage: number + 1 for number, passage in enumerate(hot_ids)}
    weights = zipf_weights(params.hot_set, params.alpha)

    system = random_text(tokenizer, text_rng, params.system_tokens)
    arrivals = poisson_arrivals(stream(seed, "arrivals"), params.num_requests, params.qps)
    requests: list[TraceRequest] = []
    for number, arrival in enumerate(arrivals):
        hot = bool(choice_rng.random() < params.r_hot)
        chosen: list[int] = []
        if hot:
            num_hot = params.hot_count
            if num_hot == -1:
                num_hot = int(choice_rng.integers(1, params.k + 1))
            chosen = [hot_ids[r] for r in draw_without_repeats(choice_rng, weights, num_hot)]
        chosen += sample_distinct(choice_rng, cold_ids, params.k - len(chosen))
        chosen = [chosen[int(i)] for i in choice_rng.permutation(len(chosen))]
        question = random_text(tokenizer, text_rng, params.question_tokens)
        requests.append(
            TraceRequest(
                rid=f"r{number:06d}",
                arrival=arrival,
                system=system,
                segments=tuple(Segment(passage_id(i), pool[i]) for i in chosen),
                suffix=f"Question: {question}",
                max_tokens=params.max_tokens,
                reorder=True,
                hot=hot,
                meta={"hot_ranks": {passage_id(i): rank[i] for i in chosen if i in rank}},
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
