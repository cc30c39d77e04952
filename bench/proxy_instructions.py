"""The proxy's CPU cost per request, counted in instructions.

    python -m bench.proxy_instructions [--ref GIT_REF] [--requests 500]

Wall-clock CPU seconds on this shared 2-core machine move by 10-30 % from run to run,
which hides any change smaller than that. Instructions do not: valgrind's callgrind
counts them the same whatever else the machine does (within about 1 % here).

The proxy (`prism-proxy serve --policy fifo --window-ms 0`) runs under callgrind in
front of the stub backend (`bench.stub_backend`, not under valgrind), once per load:
`--warm` requests, then `--warm` + `--requests`. The difference of the two totals,
divided by `--requests`, is what one request costs; start-up, warm-up and shutdown
cancel out. Two loads, each sent one request at a time:

* `chat`: non-streamed chat completions of 8 tokens (the peer table's P50 request);
* `stream`: streamed chat completions of 256 tokens (also given per content chunk);
* `agent`: non-streamed 8-token chats of agents re-sending their history each turn
  (`bench.agent_chats`: ~23k characters, ~4.9k tokens per request). Not in the default
  `--loads`; a request costs ~20x a `chat` under valgrind.

`--incremental` has the stub stream deltas, as SGLang does with
`--incremental-streaming-output`, instead of its default cumulative text and ids.

With `--ref`, the same for another git revision, checked out in a temporary worktree
and run with this environment; the table then shows both and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from bench.agent_chats import agent_turns
from bench.stub_backend import run_stub
from loadgen.stack.processes import free_port, proxy_args, wait_healthy
from prism_tokens.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "Say something short."}]}
LOADS = {"chat": {"max_tokens": 8}, "stream": {"max_tokens": 256, "stream": True}}


def bodies(load: str, requests: int) -> list[dict[str, Any]]:
    """The first `requests` bodies of `load` (the same sequence in every run)."""
    if load == "agent":
        turns = agent_turns(load_tokenizer(), requests)
        return [{**CHAT, "messages": messages, "max_tokens": 8} for messages in turns]
    # A new user message each time, as real users send (the proxy caches tokenized
    # pieces of chats; a repeated message would be a cache hit).
    users = ({"role": "user", "content": f"Say something short. ({n})"} for n in range(requests))
    return [{**CHAT, "messages": [user], **LOADS[load]} for user in users]


async def send(url: str, load: str, requests: int) -> int:
    """`requests` requests of `load`, one at a time; returns the content chunks seen."""
    chunks = 0
    async with aiohttp.ClientSession() as session:
        for body in bodies(load, requests):
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
                async for line in response.content:
                    chunks += line.startswith(b"data: {")
    return chunks


def total_instructions(out_file: Path) -> int:
    """The `totals:` (or `summary:`) line of a callgrind output file."""
    match = re.search(r"^(?:totals|summary): (\d+)", out_file.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{out_file}: no totals line")
    return int(match.group(1))


def counted_run(tree: Path, backend: str, load: str, requests: int, log_dir: Path) -> int:
    """Instructions the proxy from `tree` executed, start to exit, serving `requests`."""
    port = free_port()
    out_file = log_dir / f"callgrind-{port}.out"
    log_path = log_dir / f"proxy-{port}.log"
    command = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
        sys.executable, "-m", "prism_proxy",
        *proxy_args({"backend": backend, "tokenizer": "builtin", "port": port, "policy": "fifo",
                     "window_ms": 0, "log_level": "warning"}),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}  # `-m` also looks in the cwd first
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tree)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, timeout_s=300.0, path="/health")
        asyncio.run(send(url, load, requests))
    finally:
        process.terminate()
        process.wait(timeout=120)
    return total_instructions(out_file)


def per_request(tree: Path, backend: str, load: str, args: argparse.Namespace, log_dir: Path):
    base = counted_run(tree, backend, load, args.warm, log_dir)
    more = counted_run(tree, backend, load, args.warm + args.requests, log_dir)
    return (more - base) / args.requests


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """`ref` checked out in a temporary directory (removed afterwards)."""
    directory = Path(tempfile.mkdtemp(prefix="prism-ref-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(directory), ref],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield directory
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(directory)],
            check=False, capture_output=True,
        )  # fmt: skip
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--warm", type=int, default=100)
    parser.add_argument("--ref", default="", help="a git revision to compare with")
    parser.add_argument("--loads", default="chat,stream")
    parser.add_argument(
        "--incremental",
        action="store_true",
        help="the stub streams deltas (SGLang's --incremental-streaming-output)",
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    loads = [load.strip() for load in args.loads.split(",")]
    rows: dict[str, dict[str, float]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="prism-icount-") as tmp,
        run_stub(Path(tmp), incremental=args.incremental) as stub,
        contextlib.ExitStack() as stack,
    ):
        trees = {"this tree": ROOT}
        if args.ref:
            trees[args.ref] = stack.enter_context(worktree(args.ref))
        for name, tree in trees.items():
            for load in loads:
                rows.setdefault(load, {})[name] = cost = per_request(
                    tree, stub.url, load, args, Path(tmp)
                )
                print(f"  {name} {load}: {cost / 1e6:.3f} M instructions per request", flush=True)
        chunks_per_stream = asyncio.run(send(stub.url, "stream", 1)) if "stream" in loads else 0
    names = list(trees)
    print()
    header = " | ".join(f"{name} (M instr./request)" for name in names)
    ratio = f" | {names[0]} / {names[1]}" if len(names) == 2 else ""
    print(f"| load | {header}{ratio} |")
    print("|---" * (len(names) + 1 + bool(ratio)) + "|")
    for load, costs in rows.items():
        cells = " | ".join(f"{costs[name] / 1e6:.3f}" for name in names)
        extra = f" | {costs[names[0]] / costs[names[1]]:.2f}" if ratio else ""
        print(f"| {load} | {cells}{extra} |")
    if chunks_per_stream:
        for name in names:
            per_chunk = rows["stream"][name] / chunks_per_stream
            print(f"{name}: {per_chunk / 1e3:.1f} k instructions per streamed chunk")
    mode = "incremental" if args.incremental else "cumulative"
    print(
        f"({args.requests} requests per load after {args.warm}, one at a time, fifo, "
        f"window 0; the backend streams {mode} chunks)"
    )


if __name__ == "__main__":
    main()
