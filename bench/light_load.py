"""What the proxy costs below the knee on a real SGLang: P99 TTFT of each
line over SGLang alone, measured side by side in one run.

    python -m bench.light_load [--qps 8,16] [--num-requests 240] [--rounds 2]

Two unmodified SGLang 0.5.23 servers run on this CPU with the tiny model
(`sglang_cpu.serve`): one with SGLang's own radix cache (`stock`), one
with the DART plugin and its control RPC (`dart`). Every line replays the same
zipf_hotspot trace (the sweep's, same seed) at each load, on a flushed cache:

* `sglang`: the engine alone (stock), prompts in the client's order (`--api native`);
* `sglang-dart`: the engine alone with the DART plugin loaded, no proxy: the plugin's
  own cost in SGLang's scheduler;
* `fifo`: the proxy in front of stock SGLang, FIFO admission, hinted requests;
* `prism-view`: the proxy's default QAS in front of stock SGLang, no control RPC
  (residency from the proxy's own view): QAS and the proxy without DART;
* `prism`: as deployed and measured: QAS, DART, pushes and residency through the control
  RPC;
* `prism-nopush`: the same with the proxy's pushes of P̂_t switched off (this module runs
  the proxy with `ControlClient.push` a no-op): what the pushes into SGLang's scheduler
  process cost.

Lines alternate within each round, so drift on this shared 2-core machine falls on all
of them alike. Printed per load: P99 and mean TTFT per line (mean over rounds), the
ratio of each line's P99 to `sglang`'s, and, for the proxied lines, the proxy's mean
admission wait, its QAS round time and its control-RPC pushes (its own metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadgen.clients.replay import ReplayConfig, replay
from loadgen.experiments.sweep import SweepConfig, ensure_trace, metric_totals
from loadgen.stack.cpu_models import CPU_MODELS
from loadgen.stack.processes import ServerProcess, engine_args, free_port, run_server
from loadgen.stack.processes import proxy_args as launch_proxy
from loadgen.workloads.trace_format import read_trace

LINES = ("sglang", "sglang-dart", "fifo", "prism-view", "prism", "prism-nopush")
WITHOUT_PUSHES = "proxy-without-pushes"  # argv[1]: run the proxy with pushes off


@dataclass(frozen=True)
class Engine:
    server: ServerProcess
    control_url: str | None
    token: str | None

    def fresh(self) -> None:
        """An empty radix tree (and, with DART, an empty priority table)."""
        httpx.post(self.server.url + "/flush_cache", timeout=30.0).raise_for_status()
        if self.control_url is not None:
            headers = {"Authorization": f"Bearer {self.token}"}
            httpx.post(self.control_url + "/prism/reset", headers=headers, timeout=10.0)


@contextlib.contextmanager
def engine(kind: str, log_dir: Path, sglang_python: str) -> Iterator[Engine]:
    model = CPU_MODELS["tiny"]
    settings = {"model": "tiny", "sglang": model.sglang, "max_total_tokens": model.kv_tokens}
    control_url = token = None
    if kind == "dart":
        port, token = free_port(), secrets.token_hex(16)
        settings |= {"eviction": "dart", "control_port": port}
        control_url = f"http://127.0.0.1:{port}"
    else:
        settings["eviction"] = "stock"
    args = engine_args(settings)
    with run_server(
        "sglang_cpu.serve",
        args,
        log_dir=log_dir,
        name=f"sglang-{kind}",
        python=sglang_python,
        startup_timeout_s=300.0,
        env={"PRISM_CONTROL_TOKEN": token} if token else None,
    ) as server:
        yield Engine(server, control_url, token)


DART_LINES = ("sglang-dart", "prism", "prism-nopush")


def proxy_args(line: str, target: Engine) -> list[str]:
    policy = "fifo" if line == "fifo" else "prism"
    settings = {"backend": target.server.url, "policy": policy, "tokenizer": "builtin"}
    settings["log_level"] = "warning"
    if line in ("prism", "prism-nopush"):
        settings["control_url"] = str(target.control_url)
    args = launch_proxy(settings)
    return [WITHOUT_PUSHES, *args] if line == "prism-nopush" else args


def run_line(line: str, engines: dict[str, Engine], trace: Any, log_dir: Path) -> dict[str, Any]:
    target = engines["dart" if line in DART_LINES else "stock"]
    target.fresh()
    if line.startswith("sglang"):
        results = asyncio.run(replay(trace, ReplayConfig(target.server.url, api="native")))
        return {"summary": results["summary"], "proxy": {}}
    module = "bench.light_load" if line == "prism-nopush" else "prism_proxy"
    env = {"PRISM_CONTROL_TOKEN": target.token} if target.token else None
    with run_server(module, proxy_args(line, target), log_dir=log_dir, name=line, env=env) as proxy:
        results = asyncio.run(replay(trace, ReplayConfig(proxy.url, api="prism")))
        counters = metric_totals(httpx.get(proxy.url + "/metrics", timeout=10.0).text)
    return {"summary": results["summary"], "proxy": counters}


def proxy_breakdown(counters: dict[str, float]) -> dict[str, float | None]:
    """Mean admission wait and QAS round time (ms) and the pushes, from the proxy's
    own metrics."""

    def mean_ms(name: str) -> float | None:
        count = counters.get(f"prism:{name}_count", 0.0)
        return 1000.0 * counters.get(f"prism:{name}_sum", 0.0) / count if count else None

    return {
        "admission_wait_ms": mean_ms("admission_wait_seconds"),
        "qas_round_ms": mean_ms("qas_round_seconds"),
        "pushes": counters.get("prism:control_rpc_pushes_total"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qps", default="8,16")
    parser.add_argument("--num-requests", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lines", default=",".join(LINES))
    parser.add_argument("--sglang-python", default=".venv-sglang/bin/python")
    parser.add_argument("--out", type=Path, default=None, help="write every run's numbers here")
    args = parser.parse_args(argv)
    lines = [line for line in args.lines.split(",") if line]
    unknown = sorted(set(lines) - set(LINES))
    if unknown or "sglang" not in lines:
        parser.error(f"--lines: choose from {', '.join(LINES)}, with sglang (the reference)")
    loads = [float(q) for q in args.qps.split(",")]
    work = Path(tempfile.mkdtemp(prefix="light-load-"))
    config = SweepConfig(
        out=work, lines=(), qps=tuple(loads), num_requests=args.num_requests, seed=args.seed
    )
    runs: dict[tuple[float, str], list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        kinds = {"stock"} | ({"dart"} if set(DART_LINES) & set(lines) else set())
        engines = {
            kind: stack.enter_context(engine(kind, work / "logs", args.sglang_python))
            for kind in sorted(kinds)
        }
        for qps in loads:
            trace = read_trace(ensure_trace(config, qps))
            for round_index in range(args.rounds):
                for line in lines:
                    run = run_line(line, engines, trace, work / "logs")
                    runs.setdefault((qps, line), []).append(run)
                    summary = run["summary"]
                    print(
                        f"  {qps:g} QPS round {round_index + 1} {line:>11}: "
                        f"P99 {summary['p99_ttft_ms']:.0f} ms, mean {summary['mean_ttft_ms']:.0f}"
                        f" ms, hit {100 * summary['hit_rate']:.1f} %, failed {summary['failed']}",
                        file=sys.stderr,
                        flush=True,
                    )
    print(f"\nlight load on SGLang 0.5.23 (CPU, tiny model), {args.num_requests} requests, "
          f"{args.rounds} round(s), seed {args.seed}")  # fmt: skip
    header = "| QPS | line | P99 TTFT (ms) | × sglang | mean TTFT (ms) | hit | admission wait (ms) "
    print(header + "| QAS round (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    table = []
    for qps in loads:
        reference = statistics.fmean(r["summary"]["p99_ttft_ms"] for r in runs[(qps, "sglang")])
        for line in lines:
            done = runs[(qps, line)]
            p99 = statistics.fmean(r["summary"]["p99_ttft_ms"] for r in done)
            mean = statistics.fmean(r["summary"]["mean_ttft_ms"] for r in done)
            hit = statistics.fmean(r["summary"]["hit_rate"] for r in done)
            parts = [proxy_breakdown(r["proxy"]) for r in done if r["proxy"]]
            wait = _mean([p["admission_wait_ms"] for p in parts])
            qas = _mean([p["qas_round_ms"] for p in parts])
            row = {"qps": qps, "line": line, "p99_ttft_ms": p99, "ratio": p99 / reference,
                   "mean_ttft_ms": mean, "hit_rate": hit, "admission_wait_ms": wait,
                   "qas_round_ms": qas}  # fmt: skip
            table.append(row)
            print(
                f"| {qps:g} | {line} | {p99:.0f} | {p99 / reference:.2f} | {mean:.0f} | "
                f"{100 * hit:.1f} % | {_fmt(wait)} | {_fmt(qas, 2)} |"
            )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        raw = [{"qps": q, "line": line, "runs": r} for (q, line), r in runs.items()]
        document = {"argv": sys.argv, "table": table, "runs": raw}
        (args.out / "light_load.json").write_text(json.dumps(document, indent=1) + "\n")
    return 0


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def serve_without_pushes(argv: list[str]) -> int:
    """The proxy's own CLI, with its pushes of P̂_t to DART switched off."""
    from prism_proxy import cli
    from prism_proxy.backend.control import ControlClient

    ControlClient.push = lambda self, table: None  # type: ignore[method-assign]
    return cli.main(argv)


if __name__ == "__main__":
    if sys.argv[1:2] == [WITHOUT_PUSHES]:
        sys.exit(serve_without_pushes(sys.argv[2:]))
    sys.exit(main())
