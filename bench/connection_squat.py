"""Connection squat: one client holding more idle connections than the proxy has
slots, reopening each one the proxy closes, beside another client (issue 36).

The squatter (127.0.0.2) keeps `--squat` connections open to the proxy, sending
nothing; whenever the proxy closes one (a 503 over a cap, a header timeout, an idle
connection closed for another client), it opens another after `--reopen-s`. Once it
holds what it can, the other client (127.0.0.1) sends a small chat on a new connection
every `--every-s` for `--seconds`, and the answers are counted. The proxy runs at its
defaults (`max_connections` 4,096) in front of prism-sim; `--before DIR` runs a checkout
of an older proxy the same way. Prints a markdown table.

    python -m bench.connection_squat [--before /work/main] [--squat 4100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.engines import proxy_args
from loadgen.stack.processes import engine_args, parse_settings, run_server

SQUATTER, VICTIM = "127.0.0.2", "127.0.0.1"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def hold(host: str, port: int, reopen_s: float, counts: Counter[str]) -> None:
    """One of the squatter's connections: open, wait for the proxy to close it, again."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(SQUATTER, 0))
        except OSError:
            counts["connect failed"] += 1
            await asyncio.sleep(reopen_s)
            continue
        counts["open"] += 1
        opened = loop.time()
        try:
            data = await reader.read(64)
            counts["refused" if data.startswith(b"HTTP/1.1 503") else "closed"] += 1
            while await reader.read(65536):
                pass
        except ConnectionError:
            counts["reset"] += 1
        finally:
            counts["open"] -= 1
            writer.close()
        if loop.time() - opened < reopen_s:
            await asyncio.sleep(reopen_s)


async def squat(url: str, args: argparse.Namespace) -> dict[str, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    counts: Counter[str] = Counter()
    holders = [
        asyncio.create_task(hold(host, int(port), args.reopen_s, counts)) for _ in range(args.squat)
    ]
    await asyncio.sleep(args.ramp_s)
    held = counts["open"]
    transport = httpx.AsyncHTTPTransport(local_address=VICTIM)
    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection each time
    statuses: Counter[int | str] = Counter()
    async with httpx.AsyncClient(transport=transport, limits=limits, timeout=30.0) as client:
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            try:
                response = await client.post(url + "/v1/chat/completions", json=CHAT)
                statuses[response.status_code] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
            await asyncio.sleep(args.every_s)
    for task in holders:
        task.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    return {"held": held, "statuses": dict(statuses), "refused": counts["refused"],
            "closed": counts["closed"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--squat", type=int, default=4100, help="connections it tries to hold")
    parser.add_argument("--reopen-s", type=float, default=1.0)
    parser.add_argument("--ramp-s", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every-s", type=float, default=0.5)
    parser.add_argument("--before", type=Path, default=None, help="an older checkout")
    parser.add_argument(
        "--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
        help="a proxy setting for every line (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the squatter's sockets
    work = Path(tempfile.mkdtemp(prefix="connection-squat-"))
    lines = ["prism"] + (["prism-before"] if args.before else [])
    results: dict[str, dict[str, Any]] = {}
    with run_server("prism_sim", engine_args({"log_level": "warning"}), log_dir=work) as sim:
        for line in lines:
            cwd = args.before if line == "prism-before" else None
            serve = proxy_args("sim", sim.url, parse_settings(args.settings))
            with contextlib.ExitStack() as stack:
                proxy = stack.enter_context(
                    run_server("prism_proxy", serve, log_dir=work, name=line, cwd=cwd)
                )
                results[line] = asyncio.run(squat(proxy.url, args))
            print(f"  {line}: {results[line]}", file=sys.stderr, flush=True)
    print(
        f"\nconnection squat on prism-sim: one client tries to hold {args.squat} idle "
        f"connections (reopening after {args.reopen_s:g} s); another sends a chat every "
        f"{args.every_s:g} s for {args.seconds:g} s"
    )
    print("| line | squatter held | other client served | its answers | squatter refused |")
    print("|---|---|---|---|---|")
    for line, r in results.items():
        tries = sum(r["statuses"].values())
        served = r["statuses"].get(200, 0)
        answers = ", ".join(f"{n} x {code}" for code, n in r["statuses"].items())
        print(f"| {line} | {r['held']} | {served} of {tries} ({served / max(tries, 1):.0%}) | "
              f"{answers} | {r['refused']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
