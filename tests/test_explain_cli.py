"""`prism-proxy explain` through its console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "explain_round.json"
SCRIPT = Path(sys.executable).parent / "prism-proxy"


def explain(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "explain", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def test_example_from_file_and_stdin_agree() -> None:
    from_file = explain(str(EXAMPLE))
    from_stdin = explain(stdin=EXAMPLE.read_text())
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout == from_stdin.stdout
    result = json.loads(from_file.stdout)
    assert set(result) >= {"priorities", "requests", "buckets", "wave", "dispatch_priorities"}
    # the shipped example is the hand-computed case of test_qas_equations
    assert [(e["rid"], e["lane"]) for e in result["wave"]] == [
        ("q2", "hot"),
        ("q5", "hot"),
        ("q1", "hot"),
        ("q3", "cold"),
    ]
    assert result["requests"]["q1"] == {"skeleton": ["d1", "d7", "d3"], "signature": ["d1"]}
    assert result["buckets"][0] == {
        "signature": ["d2"],
        "rids": ["q2", "q5"],
        "score": pytest.approx(2 + 1_400_006 / 6),
    }
    assert result["dispatch_priorities"]["d1"] == 300_003.0


@pytest.mark.parametrize("policy", ["fifo", "klpm", "contextpilot-style"])
def test_every_policy_explains(policy: str) -> None:
    document = json.loads(EXAMPLE.read_text()) | {"policy": policy}
    result = explain(stdin=json.dumps(document))
    assert result.returncode == 0, result.stderr
    wave = [e["rid"] for e in json.loads(result.stdout)["wave"]]
    assert len(wave) == 4
    if policy == "fifo":
        assert wave == ["q1", "q2", "q3", "q4"]


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ("{not json", "input"),
        ('{"queue": []}', "wave_size"),
        ('{"wave_size": -1}', "wave_size"),
        ('{"wave_size": 1, "policy": "lifo"}', "policy"),
        ('{"wave_size": 1, "queue": [{"rid": "a"}]}', "queue[0].arrival"),
        (
            '{"wave_size": 1, "queue": [{"rid": "a", "arrival": 0, "segments": "d1"}]}',
            "queue[0].segments",
        ),
        ('{"wave_size": 1, "queue": [{"rid": "", "arrival": 0}]}', "queue[0].rid"),
        ('{"wave_size": 1, "queue": [{"rid": "a", "arrival": 0, "extra": 1}]}', "queue[0].extra"),
        (
            '{"wave_size": 1, "active": [{"rid": "a", "segments": ["x", "x"]}]}',
            "active[0].segments",
        ),
        (
            '{"wave_size": 1, "queue": [{"rid": "a", "arrival": 0}, {"rid": "a", "arrival": 1}]}',
            "queue[1].rid",
        ),
        ('{"wave_size": 1, "params": {"q_cold": -1}}', "params.q_cold"),
        ('{"wave_size": 1, "params": {"kappa": "2"}}', "params.kappa"),
        ('{"wave_size": 1, "params": {"gamma": 1}}', "params.gamma"),
    ],
)
def test_bad_input_exits_2_naming_the_field(document: str, field: str) -> None:
    result = explain(stdin=document)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {field}"), lines[0]


def test_missing_file_exits_2() -> None:
    result = explain("/nonexistent/round.json")
    assert result.returncode == 2
    assert result.stderr.startswith("error: input: cannot read")


# --- a request without hints: what the proxy finds in it -----------------------
DOCS = ["The Osse flows north.", "Two bridges cross it.", "The mill is old."]


def found(body: dict) -> dict:
    result = explain(stdin=json.dumps(body))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_example_request_shows_its_documents() -> None:
    result = found(json.loads((ROOT / "examples" / "explain_request.json").read_text()))
    assert (result["outcome"], result["layout"], result["message"]) == ("found", "xml", "user")
    assert len(result["documents"]) == 2 and all(d["movable"] for d in result["documents"])


def test_documents_in_the_system_message_are_shown() -> None:
    system = "Answer from the context:\n\n<context>\n" + "\n\n".join(DOCS) + "\n</context>"
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Q?"}]}
    result = found(body)
    assert (result["outcome"], result["layout"], result["message"]) == (
        "found-ordered",
        "xml",
        "system",
    )
    assert [d["text"].strip() for d in result["documents"]] == DOCS
    assert not any(d["movable"] for d in result["documents"])  # no evidence yet
    assert result["preamble"].endswith("<context>\n") and result["suffix"] == "\n</context>"


def test_a_chat_without_documents_shows_its_turns() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    tools = [{"type": "function", "function": {"name": "f"}}]
    result = found({"messages": messages, "tools": tools})
    assert result["outcome"] == "turns" and result["tokenizer"] == "builtin"
    ends = result["message_ends"]
    assert len(ends) == 3 and ends == sorted(set(ends)) and ends[-1] < result["tokens"]
    assert result["head_tokens"] == ends[0]
    alone = found({"messages": [{"role": "user", "content": "Hi"}]})
    assert alone["outcome"] == "none"
