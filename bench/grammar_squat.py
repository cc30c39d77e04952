"""Grammar squat: one client's distinct slow-to-compile JSON schemas beside another
client's structured chat, on the real SGLang on this CPU (issue 36).

Each line gets a fresh engine-cache tag. The squatter (127.0.0.2) sends `--schemas`
chats at once, each with its own slow schema (nested bounded repetitions in a
`pattern`, `--depth`); after `--head-start-s` the victim (127.0.0.1) sends one chat
with a small new schema, and its latency is measured. Lines: straight to SGLang
(`direct`), through the proxy at its defaults (`prism`), with one new grammar a client
at a time (`prism-1-compile`), and with the per-client grammar shares lifted
(`prism-unguarded`). Prints a markdown table.

    python -m bench.grammar_squat [--depth 12] [--schemas 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.engines import engine, proxy_args
from loadgen.stack.processes import run_server

SQUATTER, VICTIM = "127.0.0.2", "127.0.0.1"
# Nested bounded repetitions; the innermost bound differs per schema and line, so that no
# cache (SGLang's by text, xgrammar's by grammar) has seen a schema before.
SLOW_PATTERN = "(([a-z]{1,%d} ){1,30}){1,%d}"
# Settings of each proxy line beyond its defaults.
LINES = {
    "prism": {},
    "prism-1-compile": {"max_client_grammar_compiles": 1},
    "prism-unguarded": {"max_client_grammar_compiles": 1000,
                        "max_client_grammars_per_minute": 1000},
}  # fmt: skip


def chat(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
    }


async def post(url: str, address: str, body: dict[str, Any]) -> tuple[int, float]:
    """(status, seconds) of one chat from `address`."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(transport=transport, timeout=900.0) as client:
        started = time.monotonic()
        response = await client.post(url + "/v1/chat/completions", json=body)
        return response.status_code, time.monotonic() - started


async def squat(url: str, args: argparse.Namespace, line: int) -> dict[str, Any]:
    tag = secrets.token_hex(6)  # new to the engine's caches

    def small(name: str) -> dict[str, Any]:
        """A quick schema, new to the engine (its property's name is)."""
        field = f"{name}_{tag}"
        return {"type": "object", "properties": {field: {"type": "boolean"}}, "required": [field]}

    # the victim alone first, with a schema as new to the engine as the one it sends later
    _, alone_s = await post(url, VICTIM, chat(small("alone"), "alone"))
    slow = []
    for i in range(args.schemas):
        inner = 30 + line * args.schemas + i
        slow.append(
            chat({"type": "string", "pattern": SLOW_PATTERN % (inner, args.depth)}, f"s{i}")
        )
    squatters = [asyncio.create_task(post(url, SQUATTER, body)) for body in slow]
    await asyncio.sleep(args.head_start_s)
    status, victim_s = await post(url, VICTIM, chat(small("beside"), "victim"))
    outcomes = await asyncio.gather(*squatters)
    statuses = Counter(code for code, _ in outcomes)
    last_s = max(seconds for _, seconds in outcomes)
    return {"alone_s": alone_s, "victim_status": status, "victim_s": victim_s,
            "squatter": dict(statuses),
            "squatter_last_s": last_s}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=12, help="nesting of the slow pattern")
    parser.add_argument("--schemas", type=int, default=8)
    parser.add_argument("--head-start-s", type=float, default=1.0)
    parser.add_argument("--sglang-python", default=".venv-sglang/bin/python")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="grammar-squat-"))
    results: dict[str, dict[str, Any]] = {}
    with engine("sglang", work, args.sglang_python) as server:
        for number, line in enumerate(("direct", *LINES)):
            with contextlib.ExitStack() as stack:
                url = server.url
                if line != "direct":
                    serve = proxy_args("sglang", server.url, LINES[line])
                    proxy = run_server("prism_proxy", serve, log_dir=work, name=line)
                    url = stack.enter_context(proxy).url
                results[line] = asyncio.run(squat(url, args, number))
            print(f"  {line}: {results[line]}", file=sys.stderr, flush=True)
    print(
        f"\ngrammar squat on SGLang: {args.schemas} slow schemas (depth {args.depth}) from "
        f"one client, a structured chat from another {args.head_start_s:g} s later"
    )
    print("| line | the other client's chat alone | beside the squat | its status | "
          "squatter's statuses | squatter's last answer |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for line, r in results.items():
        statuses = ", ".join(f"{n} x {code}" for code, n in sorted(r["squatter"].items()))
        print(f"| {line} | {r['alone_s']:.2f} s | {r['victim_s']:.2f} s | "
              f"{r['victim_status']} | {statuses} | {r['squatter_last_s']:.1f} s |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
