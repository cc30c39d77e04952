"""answer_quality: a RAG trace with reference answers, of zipf_hotspot's shape.

Each request asks one question about the invented world of `world.py` and carries `k`
retrieved passages: the passage that answers it, sometimes a second one that states the
same fact, and distractors. The distractors follow zipf_hotspot (SPEC §6): with
probability `r_hot` the request holds `hot_count` hot passages drawn by Zipf(`alpha`)
over a seeded hot set, its other slots hold distinct cold passages drawn uniformly; the
`k` passages are then shuffled (the client's order). Hot passages recur across
requests, so the trace has exact-prefix reuse for QAS and the cache to find.

Questions are distinct (passage, fact) pairs drawn uniformly. The request's `meta`
holds the reference answers, the fact key and the passages that state it
(`answer_segments`, computed from what every passage states, not assumed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from loadgen.quality.world import Fact, Passage, build_world
from loadgen.workloads.sampling import draw_without_repeats, poisson_arrivals, stream, zipf_weights
from loadgen.workloads.trace_format import Segment, TraceHeader, TraceRequest

WORKLOAD = "answer_quality"
SYSTEM_PROMPT = (
    "Answer the question using only the passages. Reply with the answer only, in a few "
    'words, for example "the Varn hills", "812 metres" or "a printer".'
)


@dataclass(frozen=True)
class QualityTraceParams:
    """Every knob of answer_quality; the defaults are the committed report's."""

    questions: int = 240
    k: int = 5
    hot_set: int = 20
    r_hot: float = 0.7
    hot_count: int = 3
    alpha: float = 1.2
    second_holder: float = 1.0  # P(a town's river passage joins, when it names the town)
    rivers: int = 30
    towns: int = 60
    people: int = 80
    mountains: int = 30
    max_tokens: int = 24
    qps: float = 1.0

    def __post_init__(self) -> None:
        if self.k < 2:
            raise ValueError("k must be at least 2 (an answer and a distractor)")
        if not 0 <= self.hot_count <= self.k - 1 or self.hot_set < self.hot_count:
            raise ValueError("hot_count must be in 0…k-1 and at most hot_set")
        if not (0.0 <= self.r_hot <= 1.0 and 0.0 <= self.second_holder <= 1.0):
            raise ValueError("r_hot and second_holder are probabilities")
        if self.questions < 1 or self.qps <= 0:
            raise ValueError("questions >= 1 and qps > 0")


def build_quality_trace(
    params: QualityTraceParams, seed: int, tokenizer_name: str = "builtin"
) -> tuple[TraceHeader, list[TraceRequest]]:
    """The header and requests of one answer_quality trace (deterministic in `seed`)."""
    world = build_world(
        stream(seed, "world"), params.rivers, params.towns, params.people, params.mountains
    )
    if len(world) < params.hot_set + params.k:
        raise ValueError(f"the world has {len(world)} passages: too few for hot_set and k")
    by_id = {p.id: p for p in world}
    pairs = [(p, fact) for p in world for fact in p.questions]
    if params.questions > len(pairs):
        raise ValueError(f"the world has only {len(pairs)} distinct questions")

    rng = stream(seed, "passages")
    order = rng.permutation(len(world)).tolist()
    hot = [world[i] for i in order[: params.hot_set]]  # hot[0] is rank 1
    rank = {p.id: number + 1 for number, p in enumerate(hot)}
    cold = [p for p in world if p.id not in rank]
    weights = zipf_weights(params.hot_set, params.alpha)
    asked = rng.choice(len(pairs), size=params.questions, replace=False).tolist()
    arrivals = poisson_arrivals(stream(seed, "arrivals"), params.questions, params.qps)

    requests: list[TraceRequest] = []
    for number, (pair_index, arrival) in enumerate(zip(asked, arrivals, strict=True)):
        answer_passage, fact = pairs[int(pair_index)]
        chosen = [answer_passage, *_second_holder(answer_passage, fact, world, params, rng)]
        is_hot = bool(rng.random() < params.r_hot)
        if is_hot and params.hot_count:
            free = weights.copy()
            for passage in chosen:
                if passage.id in rank:
                    free[rank[passage.id] - 1] = 0.0
            room = min(params.hot_count, params.k - len(chosen), int((free > 0).sum()))
            chosen += [hot[r] for r in draw_without_repeats(rng, free, room)]
        taken = {p.id for p in chosen}
        spare = [p for p in cold if p.id not in taken]
        picks = rng.choice(len(spare), size=params.k - len(chosen), replace=False)
        chosen += [spare[int(i)] for i in picks]
        chosen = [chosen[int(i)] for i in rng.permutation(len(chosen))]
        holders = [p.id for p in chosen if fact.key in by_id[p.id].states]
        requests.append(
            TraceRequest(
                rid=f"q{number:04d}",
                arrival=arrival,
                system=SYSTEM_PROMPT,
                segments=tuple(Segment(p.id, f"Passage: {p.text}") for p in chosen),
                suffix=f"Question: {fact.question}",
                max_tokens=params.max_tokens,
                reorder=True,
                hot=is_hot,
                meta={
                    "question": fact.question,
                    "answers": list(fact.answers),
                    "fact": "/".join(fact.key),
                    "answer_segments": holders,
                    "hot_ranks": {p.id: rank[p.id] for p in chosen if p.id in rank},
                },
            )
        )
    header = TraceHeader(
        workload=WORKLOAD,
        params={**asdict(params), "world_passages": len(world), "distinct_questions": len(pairs)},
        seed=seed,
        num_requests=len(requests),
        tokenizer=tokenizer_name,
    )
    return header, requests


def _second_holder(
    passage: Passage, fact: Fact, world: list[Passage], params: QualityTraceParams, rng
) -> list[Passage]:
    """Another passage stating the same fact (a river naming the town), with
    probability `second_holder`; none for other facts."""
    others = [p for p in world if p.id != passage.id and fact.key in p.states]
    if others and rng.random() < params.second_holder:
        return [others[int(rng.integers(len(others)))]]
    return []
