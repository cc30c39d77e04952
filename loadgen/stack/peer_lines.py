"""Sweep lines run by a third party's own server in front of the engine.

`contextpilot-real` is ContextPilot 0.5.0's HTTP server (`python -m
contextpilot.server.http_server`), pinned in `.venv-peers/contextpilot/` by `make peers`
(bench/peer-requirements/contextpilot.txt), with its own document extraction,
reordering and index, in front of the same engine as the other lines (FCFS, LRU, no
control RPC). The replay sends it plain OpenAI chat (`--set client_api=openai`).

What that server does with a plain chat (contextpilot 0.5.0, files under
`site-packages/contextpilot/server/`):

* `/v1/chat/completions` runs `_intercept_and_forward` (http_server.py:1474). It looks
  for documents in the system message (intercept_parser.py `extract_from_openai_chat`)
  and in `tool` messages (`extract_from_openai_tool_results`), never in a user message
  (only images there: `_intercept_multimodal`).
* A message's documents are found by `extract_documents` (intercept_parser.py:418) in
  "auto" mode: `<document>`-like XML elements (optionally inside `<documents>`), else
  `[n] ` labels, else a JSON `results` array. `---`/`===` separators and markdown
  headers only when a client asks for them with `X-ContextPilot-Mode`.
* System-message documents are never reordered: the reorder is gated on
  `not state.system_processed` (http_server.py:1671), and every new or reset session
  state is created with `system_processed = True` (http_server.py:1284-1285,
  1301-1302). The first tool result of a session (a session: the system prompt and the
  first user message, `_session_fingerprint`) is reordered by `_reorder_documents`
  (http_server.py:1379): one persistent `ContextPilot` index (live_index.py), built on
  the first request (no reorder) and searched by `build_incremental` on every later one,
  which moves the documents of the best-matching indexed context to the front. A later
  tool result in the same session is deduplicated instead (documents seen earlier in
  the session dropped, http_server.py:1700-1745): every trace request here has its own
  question, so each is a session of its own.
* Nothing is evicted from that index: `/evict` (which a patched SGLang calls,
  CONTEXTPILOT_INDEX_URL) acts on the `/reorder` index only (http_server.py:817-880),
  and only `/reset` clears it. With no `/reorder` call no `rid` is added either
  (http_server.py:1840). It forwards with one aiohttp session (http_server.py:357),
  whose default pool holds 100 connections: beyond 100 requests in flight, requests
  wait there for a connection.

So of loadgen's layouts it acts only on `tool` (`loadgen.clients.apis.tool_messages`); with the
documents in the user message it is a pass-through. `check_peer_lines` holds the sweep
to that. The twin cannot run the line (`TWIN_REFUSAL`).

`contextpilot-rag` is ContextPilot's own RAG usage, the one its README documents for
online inference: the client asks ContextPilot for each request's document order
before it sends the request, and sends it straight to the engine (ContextPilot's
`cp.optimize(docs, query)`, served by the same server as `POST /reorder`). The
server runs in its default live (stateful) mode: one index of every earlier
request's documents, searched and grown by each call (`_reorder_stateful`,
http_server.py:570), never evicted (eviction sync needs an engine patched to call
`/evict`, which an unmodified SGLang does not). The replay calls `/reorder` at each
request's send time with the request's document texts
(`loadgen.clients.replay.contextpilot_order`), so its time counts in the request's
TTFT as it would for ContextPilot's user, and writes the documents in the sweep's
layout in that order, so every line sends the same text and only the order differs.
ContextPilot's `optimize` also adds an importance-ranking line to a system message it
writes itself; that text would make its prompts differ from every other line's, so it
is left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.clients.apis import CHAT_LAYOUTS
from loadgen.stack.processes import ServerProcess, peer_args, run_server

ROOT = Path(__file__).resolve().parents[2]  # the checkout (this file: loadgen/stack/peer_lines.py)
PEERS_DIR = ROOT / ".venv-peers"
HOST = "127.0.0.1"
# sglang-router fetches the backend model's tokenizer from the Hugging Face hub at start
# (and goes on without it); these keep any such attempt offline, on a closed port.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}

CONTEXTPILOT_VERSION = "0.5.0"
CONTEXTPILOT_MODULE = "contextpilot.server.http_server"


def contextpilot_args(backend_url: str) -> list[str]:
    """ContextPilot's server arguments after `-m <module>` (the port is appended):
    live mode (its default), the backend, and its per-request info logs off."""
    return peer_args({"host": HOST, "infer_api_url": backend_url, "log_level": "warning"})


@dataclass(frozen=True)
class PeerServer:
    """A third party's server a sweep line runs in front of the engine."""

    label: str  # the sweep line
    venv_name: str  # .venv-peers/<venv_name>, from `make peers`
    package: str  # its distribution, whose installed version must be `version`
    version: str
    module: str
    health_path: str  # 200 once it serves (ContextPilot's /health is 503 until /reorder)
    layouts: tuple[str, ...]  # client layouts it acts on (loadgen.clients.apis.CHAT_LAYOUTS)
    # where the client sends its requests: "server" (to this server, which forwards
    # them) or "engine" (straight to the engine, after asking this server's
    # `reorder_path` for each request's document order)
    sends_to: str = "server"
    reorder_path: str | None = None

    @property
    def python(self) -> Path:
        return PEERS_DIR / self.venv_name / "bin" / "python"

    def args(self, backend_url: str) -> list[str]:
        return contextpilot_args(backend_url)

    def command(self, backend_url: str) -> list[str]:
        """The command line the sweep runs (`--port P` appended)."""
        return [str(self.python), "-m", self.module, *self.args(backend_url)]


CONTEXTPILOT_REAL = PeerServer(
    label="contextpilot-real",
    venv_name="contextpilot",
    package="contextpilot",
    version=CONTEXTPILOT_VERSION,
    module=CONTEXTPILOT_MODULE,
    health_path="/",
    layouts=("tool",),
)
CONTEXTPILOT_RAG = dataclasses.replace(
    CONTEXTPILOT_REAL,
    label="contextpilot-rag",
    layouts=CHAT_LAYOUTS,
    sends_to="engine",
    reorder_path="/reorder",
)
PEER_SERVERS = {server.label: server for server in (CONTEXTPILOT_REAL, CONTEXTPILOT_RAG)}

TWIN_REFUSAL = (
    "the twin cannot run ContextPilot's lines (contextpilot-real, contextpilot-rag): "
    "their order comes from ContextPilot's own live index (a tree of earlier requests' "
    "documents that every request searches and grows), "
    "code that imports numpy and scipy and runs only in its venv (.venv has no scipy), "
    "which PRISM would have to re-implement (that is contextpilot-style); and the twin "
    "does not model its server (its pool of 100 backend connections queues requests "
    "beyond 100 in flight). Run it on the real stack: prism-loadgen sweep"
)


def installed_version(server: PeerServer) -> str:
    """The version of `server.package` in its venv; ValueError (saying `make peers`)
    when the venv is absent or its server module does not import."""
    hint = f"run `make peers` (or `make peers PEERS={server.venv_name}`)"
    if not server.python.exists():
        raise ValueError(f"{server.label} needs {server.python.parent.parent}: {hint}")
    code = (
        f"import importlib.metadata, {server.module}; "
        f"print(importlib.metadata.version({server.package!r}))"
    )
    done = subprocess.run(
        [str(server.python), "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"{server.label}: {server.module} does not import ({reason}): {hint}")
    return done.stdout.strip().splitlines()[-1]


def require_installed(server: PeerServer) -> None:
    """ValueError unless the pinned version of `server` is installed (`make peers`)."""
    version = installed_version(server)
    if version != server.version:
        raise ValueError(
            f"{server.label} is pinned to {server.package}=={server.version} but "
            f"{version} is installed: run `make peers`"
        )


def check_peer_lines(labels: list[str], *, engine: str, client_api: str, layout: str) -> None:
    """ValueError unless every peer line among `labels` can run as asked: on the real
    stack, sent plain chat in a layout its server acts on, its pinned version installed."""
    for label in labels:
        server = PEER_SERVERS.get(label)
        if server is None:
            continue
        if engine == "twin":
            raise ValueError(TWIN_REFUSAL)
        if client_api != "openai" or layout not in server.layouts:
            raise ValueError(
                f"{label} takes plain chat with its documents where its server reorders "
                f"them: --set client_api=openai --set layout=<one of {', '.join(server.layouts)}> "
                f"(loadgen.stack.peer_lines says why)"
            )
        require_installed(server)


@contextlib.contextmanager
def run_peer_server(
    server: PeerServer, backend_url: str, *, log_dir: Path, startup_timeout_s: float = 60.0
) -> Iterator[ServerProcess]:
    """Run `server` in front of `backend_url` until the block exits (ready first)."""
    require_installed(server)  # the clear message when the venv is gone
    with run_server(
        server.module,
        server.args(backend_url),
        log_dir=log_dir,
        name=f"peer-{server.label}",
        health_path=server.health_path,
        startup_timeout_s=startup_timeout_s,
        env=OFFLINE_ENV,
        python=str(server.python),
    ) as process:
        yield process


def index_activity(log_text: str) -> dict[str, Any]:
    """What ContextPilot's index did, from the lines its `build_incremental` prints to
    stdout on every request it reorders (live_index.py): contexts it searched and how
    many matched an indexed one (a match is what moves documents to the front)."""
    searched = log_text.count("INCREMENTAL BUILD - Search, Reorder, Build, Merge")
    matched = sum(int(n) for n in re.findall(r"Found (\d+) contexts with matches", log_text))
    return {
        "index_built": "INDEX IS NOW LIVE" in log_text,
        "searched": searched,
        "matched": matched,
    }


def peer_record(
    server: PeerServer, backend_url: str, layout: str, process: ServerProcess
) -> dict[str, Any]:
    """What a peer line ran, for its result's `variant`: the server, its pinned version
    (checked when it started), its command line, the client layout, and what its index
    did (from its log, read once it has stopped)."""
    port = process.url.rsplit(":", 1)[1]
    return {
        "name": server.package,
        "version": server.version,
        "command": [*server.command(backend_url), *peer_args({"port": port})],
        "layout": layout,
        "index": index_activity(process.log_text()),
    }
