"""The sweep's ContextPilot lines: ContextPilot 0.5.0's own server, pinned in
`.venv-peers/contextpilot` (`make peers`), beside prism-sim over real HTTP:
`contextpilot-real` in front of it, `contextpilot-rag` asked by the client for each
request's document order (its documented RAG usage).

* It reorders the documents of the `tool` layout, and the engine caches the prompt in
  ContextPilot's order: the cached prefix of a request is exactly what it shares with
  the earlier prompt once its documents are in the order ContextPilot reports.
* A sweep runs the line and records what ran (command, version, layout, index).
* Asked for an order, ContextPilot puts the documents of the context it indexed first
  in that context's order; the engine then caches that shared prefix.
* Without the venv, in the twin, or with a layout it ignores, the line fails saying why.

The live tests skip only when `.venv-peers/contextpilot` is absent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import httpx
import pytest
from sim_support import common_prefix

import loadgen.stack.peer_lines as peer_lines
from loadgen.cli import main
from loadgen.clients.apis import build_request, chat_messages
from loadgen.clients.replay import contextpilot_order
from loadgen.stack.lines import ALL_POLICIES, KNOWN_LINES, base_line
from loadgen.stack.peer_lines import (
    CONTEXTPILOT_RAG,
    CONTEXTPILOT_REAL,
    check_peer_lines,
    run_peer_server,
)
from loadgen.stack.processes import run_server
from loadgen.workloads.trace_format import Segment, TraceRequest
from prism_tokens.chat import content_format, template_messages
from prism_tokens.tokenizer import load_tokenizer

installed = pytest.mark.skipif(
    not CONTEXTPILOT_REAL.python.exists(),
    reason="ContextPilot's venv .venv-peers/contextpilot is absent (make peers)",
)

WORDS = ("harbour", "lantern", "quarry", "meadow", "falcon", "orchard", "glacier", "canyon")
DOCS = {
    name: f"{name} " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(60))
    for i, name in enumerate("ABCDEFGH")
}
SYSTEM = "You answer from the retrieved documents only."


def request(rid: str, order: str, question: str) -> TraceRequest:
    return TraceRequest(
        rid=rid,
        arrival=0.0,
        system=SYSTEM,
        segments=tuple(Segment(id=name, text=DOCS[name]) for name in order),
        suffix=f"Question: {question}?",
        max_tokens=4,
        reorder=True,
        hot=False,
    )


def engine_ids(req: TraceRequest, order: str) -> list[int]:
    """The token ids prism-sim serves for `req` with its documents in `order`, rendered
    as its OpenAI endpoint renders a chat (prism_sim.openai_api._chat_prompt)."""
    tokenizer = load_tokenizer("builtin")
    reordered = request(req.rid, order, req.suffix.removeprefix("Question: ")[:-1])
    messages = json.loads(json.dumps(chat_messages(reordered, "tool")))
    fmt = content_format(tokenizer.chat_template)
    text = tokenizer.render_chat(
        template_messages(messages, fmt, final_assistant=True), add_generation_prompt=True
    )
    return tokenizer.encode(text)


def send(client: httpx.Client, url: str, req: TraceRequest) -> tuple[dict | None, int]:
    """One streamed chat as the replay sends it (`--set client_api=openai --set layout=tool`):
    ContextPilot's X-ContextPilot-Result header and the engine's cached tokens."""
    path, body = build_request("openai", req, "m", layout="tool")
    response = client.post(url + path, json=body)
    assert response.status_code == 200, response.text[:300]
    usage = None
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            usage = json.loads(line[5:]).get("usage") or usage
    assert usage is not None
    header = response.headers.get("x-contextpilot-result")
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return (json.loads(header) if header else None), cached


@installed
@pytest.mark.slow
def test_engine_sees_contextpilots_order(tmp_path: Path) -> None:
    first = request("r1", "ABCD", "which bridge")
    second = request("r2", "CAEB", "which river")  # A, B, C again, in another order
    with (
        run_server("prism_sim", ["--speed", "20"], log_dir=tmp_path) as sim,
        run_peer_server(CONTEXTPILOT_REAL, sim.url, log_dir=tmp_path) as peer,
        httpx.Client(timeout=60.0) as client,
    ):
        result, cached = send(client, peer.url, first)
        assert result is None and cached == 0  # its index is built; nothing to reorder
        result, cached = send(client, peer.url, second)
    assert result is not None and result["sources"] == {"system": 0, "tool_results": 1}
    (detail,) = result["reorder_details"]
    order = "".join("CAEB"[i] for i in detail["reordered_order"])
    # Documents of the indexed context first, in its order: the shared prefix.
    assert order[:3] == "ABC" and sorted(order) == sorted("CAEB")
    # The engine cached exactly what the prompt in ContextPilot's order shares with the
    # first prompt: it received that order, not the client's.
    assert cached == common_prefix(engine_ids(first, "ABCD"), engine_ids(second, order))
    assert cached > common_prefix(engine_ids(first, "ABCD"), engine_ids(second, "CAEB")) + 200


@installed
@pytest.mark.slow
def test_sweep_runs_contextpilot_real(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    argv = ["sweep", "--out", str(out), "--policies", "contextpilot-real", "--qps", "40"]
    argv += ["--num-requests", "24", "--speed", "4", "--set", "client_api=openai"]
    assert main([*argv, "--set", "layout=tool", "--no-report"]) == 0
    doc = json.loads((out / "results" / "contextpilot-real_qps40.json").read_text())
    assert doc["summary"]["completed"] == 24 and doc["summary"]["failed"] == 0
    assert doc["config"]["api"] == "openai" and doc["config"]["layout"] == "tool"
    variant = doc["variant"]
    assert variant["peer"] == "contextpilot-real" and variant["proxy_args"] == []
    assert variant["eviction"] == "lru" and "--control-port" not in variant["sim_args"]
    assert variant["client_api"] == "openai" and variant["layout"] == "tool"
    server = variant["peer_server"]
    assert server["name"] == "contextpilot" and server["version"] == "0.5.0"
    assert server["layout"] == "tool"
    command = server["command"]
    assert command[1:3] == ["-m", "contextpilot.server.http_server"]
    assert command[command.index("--infer-api-url") + 1].startswith("http://127.0.0.1:")
    # Its index saw every request after the first, and moved documents for some.
    assert server["index"]["index_built"] and server["index"]["searched"] == 23
    assert server["index"]["matched"] > 0


def test_the_line_is_named_and_not_a_default() -> None:
    line = base_line("contextpilot-real")
    assert line.peer == "contextpilot-real" and line.policy is None
    assert (line.eviction, line.schedule_policy) == ("lru", "fcfs")
    assert "contextpilot-real" in KNOWN_LINES and "contextpilot-real" not in ALL_POLICIES
    assert "contextpilot-style" in ALL_POLICIES and "contextpilot" not in KNOWN_LINES


def test_refusals_say_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The twin cannot model it: simulate refuses before any trace is built.
    argv = ["simulate", "--out", str(tmp_path / "twin"), "--policies", "fifo,contextpilot-real"]
    assert main([*argv, "--set", "client_api=openai", "--set", "layout=tool"]) == 2
    assert "the twin cannot run ContextPilot's lines" in capsys.readouterr().err
    assert not (tmp_path / "twin" / "traces").exists()
    # A layout its server does not reorder would make it a pass-through.
    for api, layout in (("prism", "tool"), ("openai", "xml"), ("openai", "blank")):
        with pytest.raises(ValueError, match="--set client_api=openai --set layout=<one of tool>"):
            check_peer_lines(["contextpilot-real"], engine="sim", client_api=api, layout=layout)
    check_peer_lines(["fifo"], engine="twin", client_api="prism", layout="blank")
    # The RAG line's client writes the prompt itself: any chat layout, plain chat only.
    with pytest.raises(ValueError, match="--set client_api=openai"):
        check_peer_lines(["contextpilot-rag"], engine="sim", client_api="prism", layout="xml")


def test_missing_venv_says_make_peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_lines, "PEERS_DIR", tmp_path / "no-peers")
    with pytest.raises(ValueError, match="make peers"):
        check_peer_lines(["contextpilot-real"], engine="sim", client_api="openai", layout="tool")
    starting = run_peer_server(CONTEXTPILOT_REAL, "http://127.0.0.1:9", log_dir=tmp_path)
    with pytest.raises(ValueError, match="make peers"), starting:
        pass


def test_tool_layout_is_what_contextpilot_writes_back() -> None:
    """The documents sit in a tool result as ContextPilot's `_reconstruct_xml` writes
    them, after a retrieval call that is the same in every request; the question last."""
    messages = chat_messages(request("r", "BA", "why"), "tool")
    assert [m["role"] for m in messages] == ["system", "assistant", "tool", "user"]
    call, result = messages[1], messages[2]
    assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert result["content"] == (
        f"<documents>\n<document>{DOCS['B']}</document>\n<document>{DOCS['A']}</document>"
        "\n</documents>"
    )
    assert messages[3]["content"] == "Question: why?"
    assert messages[:2] == chat_messages(request("s", "CD", "how"), "tool")[:2]


@installed
@pytest.mark.slow
def test_rag_client_sends_contextpilots_order_to_the_engine(tmp_path: Path) -> None:
    """ContextPilot's RAG usage: the client asks `/reorder`, then sends to the engine.
    The second request's shared documents come first in the first one's order, and
    the engine caches the prefix that order shares."""
    import aiohttp

    first = request("r1", "ABCD", "which bridge")
    second = request("r2", "CAEB", "which river")

    async def ordered(url: str) -> list[str]:
        async with aiohttp.ClientSession() as session:
            orders = [await contextpilot_order(session, url, r) for r in (first, second)]
            fixed = dataclasses.replace(second, reorder=False)
            assert await contextpilot_order(session, url, fixed) is fixed  # not asked
        return ["".join(s.id for s in r.segments) for r in orders]

    with (
        run_server("prism_sim", ["--speed", "20"], log_dir=tmp_path) as sim,
        run_peer_server(CONTEXTPILOT_RAG, sim.url, log_dir=tmp_path) as peer,
        httpx.Client(timeout=60.0) as client,
    ):
        first_order, second_order = asyncio.run(ordered(peer.url + "/reorder"))
        assert sorted(first_order) == sorted("ABCD")
        assert second_order[:3] == first_order.replace("D", "")[:3]
        assert sorted(second_order) == sorted("CAEB")
        cached = []
        for req, order in ((first, first_order), (second, second_order)):
            arranged = request(req.rid, order, req.suffix.removeprefix("Question: ")[:-1])
            path, body = build_request("openai", arranged, "m", layout="xml")
            body["stream"] = False
            answer = client.post(sim.url + path, json=body).json()
            cached.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
    # Three documents of the second prompt come from the cache (60 words each).
    assert cached[0] == 0 and cached[1] > 200


@installed
@pytest.mark.slow
def test_sweep_runs_contextpilot_rag(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    argv = ["sweep", "--out", str(out), "--policies", "contextpilot-rag", "--qps", "40"]
    argv += ["--num-requests", "24", "--speed", "4", "--set", "client_api=openai"]
    assert main([*argv, "--set", "layout=xml", "--no-report"]) == 0
    doc = json.loads((out / "results" / "contextpilot-rag_qps40.json").read_text())
    assert doc["summary"]["completed"] == 24 and doc["summary"]["failed"] == 0
    assert doc["config"]["reorder_url"].endswith("/reorder")
    variant = doc["variant"]
    assert variant["peer"] == "contextpilot-rag" and variant["layout"] == "xml"
    server = variant["peer_server"]
    # The requests went to the engine, not through ContextPilot.
    peer_port = server["command"][server["command"].index("--port") + 1]
    assert not doc["config"]["target"].endswith(":" + peer_port)
    assert doc["config"]["reorder_url"].endswith(f":{peer_port}/reorder")
    # Every request with documents to order was searched in its index after the first.
    assert server["index"]["index_built"] and server["index"]["searched"] == 23
