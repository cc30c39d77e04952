"""The files one chat request walks through in the proxy, from its HTTP handler to the
engine's `/generate` and back (the measure of docs/architecture.md).

    python -m bench.request_walk [--stream] [--walks 5] [--show]

prism-sim runs as a process (its code is not walked); the proxy runs in this process with
its defaults (QAS `full`, residency from its own view, no control RPC, no health probes,
so no timer task calls in while the request is in flight). One unmodified OpenAI chat
completion, the documents numbered in the user message as a RAG client sends them, is
sent once to warm the caches, then `--walks` more times (a new question each), each
walked on its own. Every Python function call
in the proxy's own source (not the libraries, not the standard library) is recorded in
call order, in the event loop and in worker threads.

Printed, the median over the walks: the files walked (each once), and how many times the
walk went back into a file it had already left (a call into file B after the walk left B
for another file); then the files of the last walk. `--show` prints that walk itself,
one line per change of file.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

from loadgen.stack.processes import engine_args, run_server

ROOT = Path(__file__).resolve().parent.parent
NOT_WALKED = ("bench", "loadgen", "tests", "prism_sim", ".venv")

DOCUMENTS = [
    "The Nile flows north through eleven countries and ends in a delta on the Mediterranean.",
    "Basalt forms when lava cools quickly at the surface; granite cools slowly underground.",
    "A leap year has 366 days, adding February 29 to keep the calendar in step with the sun.",
]


def chat_body(question: str, stream: bool) -> dict[str, Any]:
    docs = "\n\n".join(f"[{i}] {text}" for i, text in enumerate(DOCUMENTS, 1))
    content = f"Answer from the documents.\n\n{docs}\n\nQuestion: {question}"
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You answer questions about documents."},
            {"role": "user", "content": content},
        ],
        "max_tokens": 8,
        "stream": stream,
    }


class Walk:
    """Records the proxy-side source file of every Python call, in order."""

    def __init__(self) -> None:
        self.files: list[str] = []
        self._lock = threading.Lock()
        self._cache: dict[str, str | None] = {}

    def _ours(self, filename: str) -> str | None:
        known = self._cache.get(filename, ...)
        if known is not ...:
            return known  # type: ignore[return-value]
        path = Path(filename)
        relative: str | None = None
        if path.is_absolute() and path.is_relative_to(ROOT):
            parts = path.relative_to(ROOT).parts
            if parts and parts[0] not in NOT_WALKED:
                relative = path.relative_to(ROOT).as_posix()
        self._cache[filename] = relative
        return relative

    def profile(self, frame: FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        file = self._ours(frame.f_code.co_filename)
        if file is not None:
            with self._lock:
                self.files.append(file)

    def __enter__(self) -> Walk:
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def changes(self) -> list[str]:
        """The walk with consecutive calls in one file merged."""
        merged: list[str] = []
        for file in self.files:
            if not merged or merged[-1] != file:
                merged.append(file)
        return merged


def summarize(changes: list[str]) -> tuple[list[str], int]:
    """(the files in order of first visit, the returns into a file already left)."""
    seen: list[str] = []
    returns = 0
    for file in changes:
        if file in seen:
            returns += 1
        else:
            seen.append(file)
    return seen, returns


QUESTIONS = (
    "How long is a leap year?",
    "What cools slowly underground?",
    "Which sea does the Nile reach?",
    "How many countries does the Nile cross?",
    "When is February 29?",
)


async def walk(backend: str, stream: bool, walks: int) -> list[Walk]:
    from prism_proxy.app import start_proxy
    from prism_proxy.config import ProxyConfig

    config = ProxyConfig(
        backend=backend, port=0, tokenizer="builtin", health_interval_s=0, log_level="warning"
    )
    proxy = await start_proxy(config)
    try:
        async with aiohttp.ClientSession() as session:

            async def send(question: str) -> None:
                url = proxy.url + "/v1/chat/completions"
                async with session.post(url, json=chat_body(question, stream)) as response:
                    response.raise_for_status()
                    await response.read()

            await send("Where does the Nile end?")
            done = []
            for i in range(walks):
                one = Walk()
                with one:
                    await send(QUESTIONS[i % len(QUESTIONS)] + " " * (i // len(QUESTIONS)))
                done.append(one)
    finally:
        await proxy.stop()
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", action="store_true", help="a streamed completion")
    parser.add_argument("--walks", type=int, default=5, help="requests walked, one by one")
    parser.add_argument("--show", action="store_true", help="print the last walk itself")
    args = parser.parse_args(argv)
    logs = Path(ROOT / "runs" / "request-walk")
    sim_args = engine_args({"tokenizer": "builtin", "speed": 50})
    with run_server("prism_sim", sim_args, log_dir=logs, name="prism-sim") as sim:
        walks = asyncio.run(walk(sim.url, args.stream, args.walks))
    counts = [summarize(w.changes()) for w in walks]
    calls = statistics.median(len(w.files) for w in walks)
    kind = "streamed" if args.stream else "non-streamed"
    print(f"one {kind} chat completion, median of {len(walks)}: {calls:g} calls in the proxy")
    print(
        f"files walked: {statistics.median(len(f) for f, _ in counts):g}; returns into a file"
        f" already left: {statistics.median(r for _, r in counts):g}"
        f" (each walk: {', '.join(str(r) for _, r in counts)})"
    )
    changes = walks[-1].changes()
    files, _ = counts[-1]
    for file in files:
        print(f"  {file}")
    if args.show:
        print("\nthe walk, one line per change of file:")
        for file in changes:
            print(f"  {file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
