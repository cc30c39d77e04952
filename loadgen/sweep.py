"""The paper's comparison: every policy × every QPS on a fresh engine and proxy (issue 6).

For each variant and QPS: start a fresh simulated engine (``python -m prism_sim``, empty
cache; ``--eviction dart`` with the control RPC for PRISM, ``lru`` for the baselines,
SPEC §5), a fresh proxy (``python -m prism_proxy serve --policy …``), replay the trace
open-loop through the proxy (``--api prism``), tear both down. Results land in
``<out>/results/<label>_qps<λ>.json``; the report (table + plots) in ``<out>``.

Speed. ``--speed F`` runs the engine's clock F× faster and replays with time scale F
(results stay in modeled seconds); the proxy's QAS window is scaled by 1/F too, so it
stays 10 ms of modeled time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from loadgen.processes import free_port, run_server

BASELINES = ("fifo", "klpm", "contextpilot")
POLICIES = (*BASELINES, "prism")
DEFAULT_QPS = (40.0, 50.0, 60.0, 70.0, 80.0)


@dataclass(frozen=True)
class Variant:
    """One line of the comparison: a proxy policy, the engine's eviction and q_cold."""

    label: str
    policy: str
    eviction: str
    q_cold: int | None = None


@dataclass(frozen=True)
class SweepConfig:
    out: Path
    variants: tuple[Variant, ...]
    qps: tuple[float, ...] = DEFAULT_QPS
    workload: str = "rag"
    num_requests: int = 2048
    seed: int = 0
    speed: float = 1.0
    profile: str = "a800-qwen3-4b"
    tokenizer: str = "builtin"
    corpus: str | None = None
    window_ms: float = 10.0
    tau2_dir: str | None = None
    sim_args: tuple[str, ...] = ()
    proxy_args: tuple[str, ...] = ()


def make_variants(
    policies: list[str], evictions: list[str], q_colds: list[int]
) -> tuple[Variant, ...]:
    """Baselines on LRU, PRISM on DART, then DART ablations and q_cold values for PRISM."""
    variants = []
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        variants.append(Variant(policy, policy, "dart" if policy == "prism" else "lru"))
    for eviction in evictions:
        if eviction != "dart" or "prism" not in policies:
            variants.append(Variant(f"prism[{eviction}]", "prism", eviction))
    for q_cold in q_colds:
        variants.append(Variant(f"prism[q_cold={q_cold}]", "prism", "dart", q_cold))
    return tuple(variants)


def trace_path(config: SweepConfig, qps: float) -> Path:
    name = f"{config.workload}_n{config.num_requests}_qps{qps:g}_seed{config.seed}.jsonl"
    return config.out / "traces" / name


def result_path(config: SweepConfig, variant: Variant, qps: float) -> Path:
    safe = variant.label.replace("[", "-").replace("]", "").replace("=", "").replace("+", "p")
    return config.out / "results" / f"{safe}_qps{qps:g}.json"


def ensure_trace(config: SweepConfig, qps: float) -> Path:
    """Generate the trace for ``qps`` once (same prompts at every QPS: same seed)."""
    path = trace_path(config, qps)
    if path.exists():
        return path
    from loadgen.agent_trace import AgentTraceParams, build_agent_trace
    from loadgen.rag_trace import RagTraceParams, build_rag_trace
    from loadgen.trace_format import write_trace
    from prism_proxy.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(config.tokenizer)
    if config.workload == "rag":
        params = RagTraceParams(num_requests=config.num_requests, qps=qps, corpus=config.corpus)
        header, requests = build_rag_trace(params, config.seed, tokenizer, config.tokenizer)
    else:
        agent = AgentTraceParams(
            num_requests=config.num_requests, qps=qps, tau2_dir=config.tau2_dir
        )
        header, requests = build_agent_trace(agent, config.seed, tokenizer, config.tokenizer)
    write_trace(path, header, requests)
    return path


def sim_command(config: SweepConfig, variant: Variant, control_port: int, token: str) -> list[str]:
    args = [
        "--profile",
        config.profile,
        "--speed",
        f"{config.speed:g}",
        "--eviction",
        variant.eviction,
        "--seed",
        str(config.seed),
        "--tokenizer",
        config.tokenizer,
    ]
    if variant.policy == "prism":
        args += ["--control-port", str(control_port), "--control-token", token]
    return [*args, *config.sim_args]


def proxy_command(
    config: SweepConfig, variant: Variant, backend: str, control_port: int, token: str
) -> list[str]:
    args = [
        "serve",
        "--backend",
        backend,
        "--policy",
        variant.policy,
        "--tokenizer",
        config.tokenizer,
        "--window-ms",
        f"{config.window_ms / config.speed:g}",
        "--log-level",
        "warning",
    ]
    if variant.policy == "prism":
        args += ["--control-url", f"http://127.0.0.1:{control_port}", "--control-token", token]
    if variant.q_cold is not None:
        args += ["--q-cold", str(variant.q_cold)]
    return [*args, *config.proxy_args]


def engine_state(url: str) -> dict[str, Any]:
    """The engine's own view after a run (``/server_info``): loop lag, evictions, …"""
    try:
        info = httpx.get(url + "/server_info", timeout=10.0).json()
        states = info.get("internal_states") or [{}]
        return {**states[0], "radix_eviction_policy": info.get("radix_eviction_policy")}
    except (httpx.HTTPError, ValueError):
        return {}


def proxy_counters(url: str) -> dict[str, float]:
    """The proxy's ``prism:`` counters, gauges and histogram sums/counts after a run,
    summed over labels."""
    try:
        return metric_totals(httpx.get(url + "/metrics", timeout=10.0).text)
    except httpx.HTTPError:
        return {}


def metric_totals(text: str) -> dict[str, float]:
    """Counter, gauge and histogram sum/count samples of a Prometheus text page, each
    sample name's values summed over its labels (``_created`` and ``_bucket`` left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type not in ("counter", "gauge", "histogram"):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket")):
                continue
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def run_point(config: SweepConfig, variant: Variant, qps: float) -> Path:
    """One fresh engine + proxy, one replay; returns the results path."""
    from loadgen.replay import ReplayConfig, replay, write_results
    from loadgen.trace_format import read_trace

    trace = read_trace(ensure_trace(config, qps))
    logs = config.out / "logs"
    token = secrets.token_hex(16)
    control_port = free_port()
    sim_args = sim_command(config, variant, control_port, token)
    with run_server("prism_sim", sim_args, log_dir=logs, name=f"sim-{variant.label}") as sim:
        proxy_args = proxy_command(config, variant, sim.url, control_port, token)
        with run_server(
            "prism_proxy", proxy_args, log_dir=logs, name=f"proxy-{variant.label}"
        ) as proxy:
            replay_config = ReplayConfig(
                target=proxy.url, api="prism", time_scale=config.speed, progress=False
            )
            results = asyncio.run(replay(trace, replay_config))
            results["engine_state"] = engine_state(sim.url)
            results["proxy_metrics"] = proxy_counters(proxy.url)
    results["variant"] = {
        **asdict(variant),
        "qps": qps,
        "speed": config.speed,
        "profile": config.profile,
        "sim_args": sim_args,
        "proxy_args": proxy_args,
    }
    path = result_path(config, variant, qps)
    write_results(path, results)
    return path


def run_sweep(config: SweepConfig, command: str) -> list[Path]:
    """Every variant at every QPS, then the report; returns the result files."""
    config.out.mkdir(parents=True, exist_ok=True)
    for stale in (config.out / "results").glob("*.json"):
        stale.unlink()  # results/ is this sweep's own output: the report reads all of it
    manifest = {
        "command": command,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "variants": [asdict(v) for v in config.variants],
        "qps": list(config.qps),
        "speed": config.speed,
        "num_requests": config.num_requests,
        "seed": config.seed,
        "profile": config.profile,
        "workload": config.workload,
        "git_commit": _git_commit(),
    }
    (config.out / "sweep.json").write_text(json.dumps(manifest, indent=1) + "\n")
    paths = []
    for qps in config.qps:
        ensure_trace(config, qps)
    for variant in config.variants:
        for qps in config.qps:
            started = time.monotonic()
            path = run_point(config, variant, qps)
            summary = json.loads(path.read_text())["summary"]
            print(
                f"{variant.label:>18} @ {qps:g} QPS: p99 TTFT "
                f"{_fmt_s(summary['p99_ttft_ms'])}, hit {_fmt_pct(summary['hit_rate'])}, "
                f"{summary['request_throughput']:.1f} req/s, failed {summary['failed']}"
                f" ({time.monotonic() - started:.0f}s wall)",
                flush=True,
            )
            paths.append(path)
    return paths


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _fmt_s(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms / 1000:.2f}s"


def _fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_sweep_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--qps", default=",".join(f"{q:g}" for q in DEFAULT_QPS))
    parser.add_argument(
        "--evictions", default="", help="DART ablations run with prism: lru,lru+active,lfu,dart"
    )
    parser.add_argument("--q-cold", default="", help="q_cold values run with prism (+dart)")
    parser.add_argument("--workload", choices=("rag", "agent"), default="rag")
    parser.add_argument("--num-requests", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speed", type=float, default=1.0, help="engine clock speed factor F")
    parser.add_argument("--profile", default="a800-qwen3-4b")
    parser.add_argument("--tokenizer", default="builtin")
    parser.add_argument("--corpus", default=None, help="MultiHop-RAG corpus.json (rag only)")
    parser.add_argument("--tau2-dir", default=None, help="tau2 package dir (agent only)")
    parser.add_argument("--window-ms", type=float, default=10.0, help="QAS window (modeled)")
    parser.add_argument("--sim-arg", action="append", default=[], help="extra prism-sim arg")
    parser.add_argument("--proxy-arg", action="append", default=[], help="extra proxy arg")
    parser.add_argument("--no-report", action="store_true")


def run_sweep_from_args(args: argparse.Namespace) -> int:
    config = SweepConfig(
        out=Path(args.out),
        variants=make_variants(
            _csv(args.policies), _csv(args.evictions), [int(q) for q in _csv(args.q_cold)]
        ),
        qps=tuple(float(q) for q in _csv(args.qps)),
        workload=args.workload,
        num_requests=args.num_requests,
        seed=args.seed,
        speed=args.speed,
        profile=args.profile,
        tokenizer=args.tokenizer,
        corpus=args.corpus,
        window_ms=args.window_ms,
        tau2_dir=args.tau2_dir,
        sim_args=tuple(a for arg in args.sim_arg for a in shlex.split(arg)),
        proxy_args=tuple(a for arg in args.proxy_arg for a in shlex.split(arg)),
    )
    command = "prism-loadgen " + shlex.join(sys.argv[1:])
    run_sweep(config, command)
    if not args.no_report:
        from loadgen.report import write_report

        paths = write_report(config.out / "results", out_dir=config.out)
        print(paths.table_text)
        for path in paths.files:
            print(f"wrote {path}")
    return 0
