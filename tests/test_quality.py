"""The answer-quality workload and `prism-loadgen quality`: SQuAD scoring,
the trace's shape and exact evidence, the client orders, and the harness end to end
through a real proxy (prism-sim answers noise; the model's run is in
docs/results/quality/)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.cli import main as loadgen_main
from loadgen.quality.metrics import (
    best_scores,
    bootstrap_mean,
    contains_answer,
    normalize_answer,
    paired_difference,
    token_f1,
)
from loadgen.quality.orders import ORDERS, answer_positions, arrange
from loadgen.quality.trace import QualityTraceParams, build_quality_trace
from loadgen.quality.world import build_world
from loadgen.workloads.sampling import stream
from loadgen.workloads.trace_format import Segment

# -- scoring (SQuAD's definitions) -------------------------------------------------


def test_normalisation_drops_case_punctuation_and_articles() -> None:
    assert normalize_answer("The  Calder Sea!") == "calder sea"
    assert normalize_answer("An apple, a day") == "apple day"


def test_token_f1_matches_hand_counts() -> None:
    # prediction "river osse flows into calder sea" (6 tokens), reference 2, overlap 2
    assert token_f1("The river Osse flows into the Calder Sea.", "Calder Sea") == pytest.approx(
        2 * (2 / 6) * 1.0 / (2 / 6 + 1.0)
    )
    assert token_f1("Calder Sea", "the Calder Sea") == 1.0
    assert token_f1("Thursday", "Friday") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("", "x") == 0.0


def test_best_scores_take_the_maximum_over_references() -> None:
    assert best_scores("in 1851", ["1851", "in 1851"]) == (1.0, 1.0, 1.0)
    f1, em, contains = best_scores("born 1851", ["1851", "in 1851"])
    assert em == 0.0 and f1 == pytest.approx(2 / 3) and contains == 1.0


def test_contains_answer_matches_whole_words_only() -> None:
    assert contains_answer("The river Osse flows into the Calder Sea.", "the Calder Sea") == 1.0
    assert contains_answer("It is 18120 metres high", "812 metres") == 0.0
    assert contains_answer("Calder", "Calder Sea") == 0.0
    assert contains_answer("anything", "") == 0.0


@given(st.lists(st.floats(0, 1), min_size=1, max_size=60))
def test_the_bootstrap_interval_holds_the_mean(values: list[float]) -> None:
    interval = bootstrap_mean(values, resamples=500)
    assert interval.low - 1e-9 <= interval.mean <= interval.high + 1e-9
    assert min(values) - 1e-9 <= interval.low and interval.high <= max(values) + 1e-9


def test_paired_difference_sees_a_shift_that_unpaired_noise_would_hide() -> None:
    control = [0.0, 1.0] * 50
    treated = [c + 0.1 for c in control]
    diff = paired_difference(treated, control, resamples=2000)
    assert diff.mean == pytest.approx(0.1) and diff.low == pytest.approx(0.1)
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 0.0])


# -- the workload --------------------------------------------------------------------


def test_the_trace_is_deterministic_and_has_the_rag_shape() -> None:
    params = QualityTraceParams(questions=240)
    header, requests = build_quality_trace(params, seed=0)
    _, again = build_quality_trace(params, seed=0)
    assert [r.to_json() for r in requests] == [r.to_json() for r in again]
    assert header.workload == "answer_quality" and len(requests) == 240
    assert all(len(r.segments) == params.k for r in requests)
    assert len({r.meta["question"] for r in requests}) == 240  # distinct questions
    holders = Counter(len(r.meta["answer_segments"]) for r in requests)
    assert set(holders) == {1, 2} and holders[2] > 0
    # zipf_hotspot's reuse: hot passages recur across requests
    uses = Counter(s.id for r in requests for s in r.segments)
    assert uses.most_common(1)[0][1] > 40


def test_answer_segments_are_exactly_the_passages_that_state_the_answer() -> None:
    world = {p.id: p for p in build_world(stream(0, "world"), 30, 60, 80, 30)}
    _, requests = build_quality_trace(QualityTraceParams(questions=120), seed=0)
    for request in requests:
        refs = [a.lower() for a in request.meta["answers"]]
        stated = [s.id for s in request.segments if any(a in s.text.lower() for a in refs)]
        assert set(request.meta["answer_segments"]) <= set(stated)
        for segment_id in request.meta["answer_segments"]:
            assert segment_id in world
        assert request.meta["answer_segments"], request.rid


def segments(*ids: str) -> list[Segment]:
    return [Segment(i, f"text of {i}") for i in ids]


def test_orders_place_the_evidence_where_they_say() -> None:
    docs = segments("a", "b", "c", "d", "e")
    ids = lambda order, holders: [s.id for s in arrange(docs, holders, order)]  # noqa: E731
    assert ids("fifo", ["e"]) == ids("prism", ["e"]) == ids("fifo-rerun", ["e"]) == list("abcde")
    assert ids("adversarial", ["e"]) == ["a", "b", "e", "c", "d"]
    assert ids("adversarial", ["a", "e"]) == ["b", "a", "e", "c", "d"]
    assert ids("answer-first", ["c"]) == ["c", "a", "b", "d", "e"]
    assert ids("answer-last", ["a"]) == ["b", "c", "d", "e", "a"]
    assert ids("no-answer", ["b", "d"]) == ["a", "c", "e"]
    assert answer_positions(arrange(docs, ["e"], "adversarial"), ["e"]) == [3]
    with pytest.raises(ValueError):
        arrange(docs, ["a"], "sideways")


@given(st.permutations(list("abcdefg")), st.integers(1, 2), st.sampled_from(ORDERS))
def test_orders_keep_every_passage_but_the_removed_evidence(
    ids: list[str], num_holders: int, order: str
) -> None:
    docs = segments(*ids)
    holders = ids[:num_holders]
    out = [s.id for s in arrange(docs, holders, order)]
    expected = [i for i in ids if i not in holders] if order == "no-answer" else ids
    assert sorted(out) == sorted(expected)
    others = [i for i in out if i not in holders]
    assert others == [i for i in ids if i not in holders]  # distractors keep client order


# -- the harness, end to end --------------------------------------------------------


def answers(out: Path, order: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"answers-{order}.jsonl").read_text().splitlines()]


def test_quality_runs_every_order_through_the_proxy(tmp_path: Path, capsys) -> None:
    """Real processes on loopback: prism-sim (DART + control RPC) and the proxy per
    order, the `openai` client, scoring and the report. prism-sim answers noise, so
    F1 is ~0; what is checked is that every question is answered and accounted."""
    out = tmp_path / "q"
    argv = ["quality", "--engine", "sim", "--out", str(out), "--questions", "12",
            "--orders", "fifo,prism,adversarial,no-answer", "--concurrency", "3"]  # fmt: skip
    assert loadgen_main(argv) == 0
    table = capsys.readouterr().out
    assert "| prism | 12 |" in table and "| no-answer | 12 |" in table
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert set(summary) == {"fifo", "prism", "adversarial", "no-answer"}
    for order, entry in summary.items():
        assert entry["questions"] == 12 and entry["failed"] == 0, order
        assert 0.0 <= entry["f1"]["low"] <= entry["f1"]["mean"] <= entry["f1"]["high"] <= 1.0
    assert summary["prism"]["hit_rate"] > 0.0  # hot passages reused
    rows = answers(out, "adversarial")
    assert all(row["answer"] for row in rows)
    assert all(row["answer_positions"] in ([3], [2, 3]) for row in rows)
    no_answer = answers(out, "no-answer")
    assert all(row["answer_positions"] == [] for row in no_answer)
    fifo = answers(out, "fifo")
    assert sum(r["prompt_tokens"] for r in no_answer) < sum(r["prompt_tokens"] for r in fifo)
    # scoring the saved answers again asks nothing and gives the same summary
    measured = json.loads((out / "summary.json").read_text())
    assert loadgen_main([*argv, "--rescore", "--engine", "sglang-cpu"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["summary"] == measured["summary"]
    assert again["measured_by"] == measured["measured_by"] != again["command"]


def test_quality_as_an_unmodified_client(tmp_path: Path, capsys) -> None:
    """`--layout`: no hints, the passages numbered in the user message; the proxy finds
    them under both orders (the prompts carry the labels the client wrote), reorders
    them under prism only, and the summary records the layout."""
    out = tmp_path / "plain"
    argv = ["quality", "--engine", "sim", "--out", str(out), "--questions", "12",
            "--orders", "fifo,prism", "--layout", "numbered"]  # fmt: skip
    assert loadgen_main(argv) == 0
    result = json.loads((out / "summary.json").read_text())
    assert result["config"]["layout"] == "numbered"
    summary = result["summary"]
    assert all(summary[o]["questions"] == 12 and summary[o]["failed"] == 0 for o in summary)
    fifo, prism = answers(out, "fifo"), answers(out, "prism")
    # the same text either way (labels follow the positions): the same prompt lengths
    assert [r["prompt_tokens"] for r in fifo] == [r["prompt_tokens"] for r in prism]
    assert summary["prism"]["hit_rate"] > summary["fifo"]["hit_rate"]
    hinted = tmp_path / "hinted"
    assert loadgen_main(["quality", "--engine", "sim", "--out", str(hinted), "--questions",
                         "12", "--orders", "fifo"]) == 0  # fmt: skip
    numbered = sum(r["prompt_tokens"] for r in fifo)
    assert numbered > sum(r["prompt_tokens"] for r in answers(hinted, "fifo"))  # the labels
    capsys.readouterr()


@pytest.mark.parametrize("layout", ["metadata", "tool"])
def test_quality_in_other_chat_layouts(tmp_path: Path, capsys, layout: str) -> None:
    """LlamaIndex's metadata rendering and passages in a retrieval tool's result: every
    question answered under both orders, the same text (prompt lengths) either way."""
    out = tmp_path / layout
    argv = ["quality", "--engine", "sim", "--out", str(out), "--questions", "12",
            "--orders", "fifo,prism", "--layout", layout]  # fmt: skip
    assert loadgen_main(argv) == 0
    result = json.loads((out / "summary.json").read_text())
    assert result["config"]["layout"] == layout
    summary = result["summary"]
    assert all(summary[o]["questions"] == 12 and summary[o]["failed"] == 0 for o in summary)
    fifo, prism = answers(out, "fifo"), answers(out, "prism")
    assert [r["prompt_tokens"] for r in fifo] == [r["prompt_tokens"] for r in prism]
    capsys.readouterr()


def test_quality_refuses_an_unknown_order(tmp_path: Path, capsys) -> None:
    argv = ["quality", "--engine", "sim", "--out", str(tmp_path), "--orders", "fifo,bogus"]
    assert loadgen_main(argv) == 2
    assert "bogus" in capsys.readouterr().err
