"""What a big non-streamed answer costs the proxy: its memory, and `/health` latency
seen from another process while the answer is made, per line, in one run.

    python -m bench.big_answer [--engine sglang|sim] [--before DIR]

Requests (non-streamed chats through the proxy, the engine's own endpoint answers
them):
* `huge`: `n = 16`, `max_tokens = 4000`, `top_logprobs = 20` (issue 34: a 103 MB answer
  that grew the proxy by 911 MB and held `/health` for up to 3,967 ms);
* `large`: `n = 4`, `max_tokens = 1000`, `top_logprobs = 20`, within the default bounds;
* `large-streamed`: the same, streamed (the proxy relays it, assembles nothing): what
  `/health` does beside the same engine work when no answer is assembled.

Lines: `prism` (this checkout's proxy, defaults), and `prism-before` (the proxy of the
checkout at `--before`, run the same way). A prober in a separate process asks the
proxy's `/health` every 20 ms throughout; the proxy's RSS is read from /proc before,
during (its peak) and after. Printed per line and request: the status, the answer's
size, the proxy's RSS growth (peak over the start), and the largest and P99 `/health`
latency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.engines import engine, proxy_args
from loadgen.stack.processes import ServerProcess, run_server

PROBE = r"""
import sys, time, httpx
url, out = sys.argv[1], sys.argv[2]
lat = []
with httpx.Client(timeout=30.0) as c:
    while True:
        t = time.monotonic()
        try:
            c.get(url + "/health")
        except httpx.HTTPError:
            break
        lat.append(time.monotonic() - t)
        with open(out, "w") as f:
            f.write(" ".join(f"{x:.4f}" for x in lat[-5000:]))
        time.sleep(0.02)
"""

REQUESTS = {
    "huge": {"n": 16, "max_tokens": 4000, "top_logprobs": 20},
    "large": {"n": 4, "max_tokens": 1000, "top_logprobs": 20},
    # the same answer streamed: relayed as it comes, nothing assembled (the control for
    # what the machine's load alone does to `/health`)
    "large-streamed": {"n": 4, "max_tokens": 1000, "top_logprobs": 20, "stream": True},
}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def measure(proxy: ServerProcess, name: str, fields: dict, work: Path) -> dict:
    out = work / f"probe-{name}-{time.monotonic_ns()}.txt"
    prober = subprocess.Popen([sys.executable, "-c", PROBE, proxy.url, str(out)])
    pid = proxy.process.pid
    start = rss_bytes(pid)
    peak = [start]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes(pid))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(1.0)
    body = {"model": "m", "temperature": 1.0, "logprobs": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell a story."}], **fields}  # fmt: skip
    began = time.monotonic()
    response = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=3600.0)
    seconds = time.monotonic() - began
    time.sleep(1.0)
    done.set()
    watcher.join()
    prober.terminate()
    prober.wait()
    text = out.read_text() if out.exists() else ""
    latencies = sorted(float(x) for x in text.split()) or [float("nan")]  # no probe answered
    return {
        "status": response.status_code,
        "answer_bytes": len(response.content),
        "seconds": seconds,
        "rss_start_mb": start / 2**20,
        "rss_growth_mb": (peak[0] - start) / 2**20,
        "health_max_ms": 1000 * latencies[-1],
        "health_p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "health_probes": len(latencies),
        "error": response.json().get("error", {}).get("message") if response.status_code != 200
        else None,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sglang", "sim"), default="sglang")
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--sglang-python", default=".venv-sglang/bin/python")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="big-answer-"))
    lines = ["prism"] + (["prism-before"] if args.before else [])
    rows = []
    with engine(args.engine, work, args.sglang_python) as server:
        for line in lines:
            serve = proxy_args(args.engine, server.url)
            cwd = args.before if line == "prism-before" else None
            with run_server("prism_proxy", serve, log_dir=work, name=line, cwd=cwd) as proxy:
                for name, fields in REQUESTS.items():
                    row = {"line": line, "request": name, **measure(proxy, name, fields, work)}
                    rows.append(row)
                    print(f"  {line} {name}: {row}", file=sys.stderr, flush=True)
    print(f"\nbig non-streamed answers through the proxy ({args.engine}); /health probed "
          "every 20 ms from another process")  # fmt: skip
    print("| line | request | status | answer | seconds | proxy RSS growth | /health max | "
          "/health P99 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['line']} | {r['request']} | {r['status']} | {r['answer_bytes'] / 1e6:.1f} MB "
              f"| {r['seconds']:.1f} | {r['rss_growth_mb']:.0f} MB | {r['health_max_ms']:.0f} ms "
              f"| {r['health_p99_ms']:.0f} ms |")  # fmt: skip
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "big_answer.json").write_text(json.dumps({"argv": sys.argv, "rows": rows},
                                                             indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
