"""Where the proxy's CPU goes under a burst, by sampling (docs/performance.md).

    python -m bench.proxy_profile [--seconds 10] [--policy fifo]

Starts the stub backend and `prism-proxy serve --policy fifo --window-ms 0` (or the
given policy with its default window), sends bursts of non-streamed 8-token chats from
64 concurrent clients (as `bench.peers` does; `--stream`: streamed 256-token chats from
64 clients, the stub streaming cumulative chunks like SGLang's default, or deltas with
`--incremental`) while py-spy
samples the proxy, and prints
the share of on-CPU samples by where the innermost frame lives: aiohttp, the lean
backend client, the tokenizer, Jinja, pydantic, admission, metrics, the handlers... and
the functions with the most samples. py-spy comes with the dev extras; it needs ptrace
rights over the proxy (root, or `kernel.yama.ptrace_scope=0`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.peers import burst, streams
from bench.stub_backend import run_stub
from loadgen.stack.processes import proxy_args, run_server

# First match wins: a frame's file path fragment → its category.
CATEGORIES = (
    ("aiohttp (server side, syscalls)", "aiohttp/"),
    ("backend client", "prism_proxy/backend/"),
    ("tokenizing (tokenizer, chat_pieces)", "prism_tokens/tokenizer.py"),
    ("tokenizing (tokenizer, chat_pieces)", "prism_tokens/chat_pieces.py"),
    ("jinja chat template", "jinja2/"),
    ("jinja chat template", "<template>"),
    ("pydantic validation", "pydantic"),
    ("pydantic validation", "prism_proxy/api/field_types.py"),
    ("pydantic validation", "prism_proxy/api/costs.py"),
    ("pydantic validation", "prism_proxy/api/hints.py"),
    ("pydantic validation", "prism_proxy/api/messages.py"),
    ("pydantic validation", "prism_proxy/api/openai_fields.py"),
    ("pydantic validation", "prism_proxy/api/chat.py"),
    ("pydantic validation", "prism_proxy/api/completions.py"),
    ("pydantic validation", "prism_proxy/api/generate.py"),
    ("admission and QAS", "prism_proxy/admission"),
    ("admission and QAS", "prism_proxy/qas/"),
    ("admission and QAS", "prism_proxy/admission/core.py"),
    ("prometheus metrics", "prometheus_client/"),
    ("prism_proxy/metrics.py", "prism_proxy/metrics.py"),
    ("OpenAI formatting", "prism_proxy/edge/openai_format.py"),
    ("prompts and serializer", "prism_proxy/prompts/jobs.py"),
    ("prompts and serializer", "prism_proxy/prompts/serializer.py"),
    ("edge", "prism_proxy/edge/"),
    ("contextlib and dataclasses", "contextlib.py"),
    ("contextlib and dataclasses", "dataclasses.py"),
    ("contextlib and dataclasses", "<string>"),
    ("asyncio", "asyncio/"),
    ("uuid", "uuid.py"),
)
FRAME = re.compile(r"(?P<function>.*?) \((?P<path>.*?)(?::\d+)?\)$")


def categorize(raw: str) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """py-spy's collapsed stacks → (samples by category, by function, total)."""
    by_category: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        match = FRAME.match(stack.split(";")[-1])
        path = match["path"] if match else ""
        function = f"{match['function']} ({path.split('site-packages/')[-1]})" if match else "?"
        category = next((name for name, part in CATEGORIES if part in path), "other")
        by_category[category] += samples
        by_function[function] += samples
    return by_category, by_function, total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--stream", action="store_true", help="streamed 256-token chats from 64 clients instead"
    )
    parser.add_argument(
        "--incremental", action="store_true", help="the stub streams deltas, not cumulative"
    )
    args = parser.parse_args(argv)
    beside = Path(sys.executable).parent / "py-spy"  # the venv's, when not on PATH
    py_spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed (it comes with the dev extras)")
    settings = {"backend": None, "tokenizer": "builtin", "log_level": "warning"}
    settings |= {"policy": args.policy, "window_ms": 0 if args.policy == "fifo" else None}
    with (
        tempfile.TemporaryDirectory(prefix="prism-profile-") as tmp,
        run_stub(Path(tmp), incremental=args.incremental) as stub,
        run_server(
            "prism_proxy",
            proxy_args({**settings, "backend": stub.url}),
            log_dir=Path(tmp),
            name="prism",
        ) as proxy,
    ):
        asyncio.run(burst(proxy.url, 500, 64))  # warm
        out = Path(tmp) / "profile.txt"
        sampler = subprocess.Popen(
            [py_spy, "record", "-p", str(proxy.process.pid), "-d", f"{args.seconds:g}",
             "-r", "500", "-f", "raw", "-o", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + args.seconds
        served = 0
        while time.monotonic() < deadline:
            if args.stream:
                asyncio.run(streams(proxy.url, 64, 1, 256))
                served += 64
            else:
                asyncio.run(burst(proxy.url, 1000, 64))
                served += 1000
        sampler.wait(timeout=args.seconds + 60)
        by_category, by_function, total = categorize(out.read_text())
    print(f"{total} on-CPU samples, {args.seconds:g} s, {served} requests, policy {args.policy}")
    print("\n| where | share of samples |\n|---|---|")
    for name, samples in by_category.most_common():
        print(f"| {name} | {samples / total:.1%} |")
    print(f"\ntop {args.top} functions (innermost frame):")
    for name, samples in by_function.most_common(args.top):
        print(f"  {samples / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
