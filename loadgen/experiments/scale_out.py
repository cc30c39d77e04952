"""Scale-out: N replicas behind sgl-model-gateway (smg), measured side by side.

    make smg-peer && prism-loadgen scale-out --out runs/scale-out [--replicas 3 --qps 40,120]

Every configuration replays the same zipf_hotspot trace on fresh processes (prism-sim
replicas on the default profile, real time) and reports the aggregate hit rate
(cached / prompt tokens), P99 and mean TTFT, and the requests each replica served:

* `single`: one replica, the proxy in front (the reference: one cache sees everything);
  every engine runs DART with its control RPC;
* `A-round_robin`, `A-cache_aware`: a PRISM sidecar (proxy, DART on the engine) per
  replica, smg in front with that policy and no routing key;
* `A-key`: the same with smg `consistent_hashing` and `X-SMG-Routing-Key` = the
  request's hottest segment by the trace's hot ranks (`loadgen.clients.routing`,
  `prism-loadgen replay --routing-key anchor`): the generator's knowledge, which a
  client has only if it counts popularity exactly;
* `A-key-canonical`: the same with the key a client computes from the request alone,
  its first segment in PRISM's canonical order (`--routing-key canonical`);
* `A-key-bounded`: `A-key` with hot anchors spread (`loadgen.clients.hot_keys`, `--routing-key
  anchor-bounded`): a hot key's request never goes to a replica holding
  `--max-replica-share` of the client's last 256 requests;
* `B-round_robin`, `B-cache_aware`: one PRISM proxy in front of smg, smg in front of the
  engines. QAS sees all traffic; the proxy's `/generate` carries token ids, so smg
  routes the canonicalised prompts. The proxy pushes P̂_t to every engine's DART
  (comma-separated `--control-url`) and reads the union of their residency; prefill
  pacing counts the replicas as one backend (it cannot see where smg sends a request).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadgen.experiments.sweep import git_commit
from loadgen.stack.peers_launch import OFFLINE_ENV, Smg
from loadgen.stack.processes import (
    ServerProcess,
    engine_args,
    free_port,
    peer_args,
    proxy_args,
    run_server,
)

CONFIGS = ("single", "A-round_robin", "A-cache_aware", "A-key", "B-round_robin", "B-cache_aware")
EXTRA_CONFIGS = ("A-key-bounded", "A-key-canonical")  # run when named in --configs
# A-<policy>: the routing key each A-key configuration sends (loadgen.clients.replay.ROUTING_KEYS)
KEY_MODES = {"key": "anchor", "key-bounded": "anchor-bounded", "key-canonical": "canonical"}
SMG = Smg()


@dataclass(frozen=True)
class Replica:
    """One engine (DART with its control RPC), and the proxy in front of it when the
    topology has sidecars."""

    engine: ServerProcess
    proxy: ServerProcess | None
    control_url: str

    @property
    def url(self) -> str:
        return (self.proxy or self.engine).url


@contextlib.contextmanager
def replica(log_dir: Path, sidecar: bool, token: str) -> Iterator[Replica]:
    control_port = free_port()
    control_url = f"http://127.0.0.1:{control_port}"
    sim = engine_args({"log_level": "warning", "eviction": "dart", "control_port": control_port})
    secret = {"PRISM_CONTROL_TOKEN": token}  # in the environment: never on a command line
    with run_server("prism_sim", sim, log_dir=log_dir, name="engine", env=secret) as engine:
        if not sidecar:
            yield Replica(engine, None, control_url)
            return
        serve = proxy_args(
            {"backend": engine.url, "log_level": "warning", "control_url": control_url}
        )
        with run_server("prism_proxy", serve, log_dir=log_dir, name="proxy", env=secret) as proxy:
            yield Replica(engine, proxy, control_url)


@contextlib.contextmanager
def gateway(
    urls: list[str], policy: str, log_dir: Path, extra_args: Sequence[str] = ()
) -> Iterator[ServerProcess]:
    """smg 1.13.0 in front of `urls` with `policy` (no retries, no breaker)."""
    if not SMG.runs():
        raise RuntimeError("smg is not installed: run `make smg-peer`")
    settings = {
        "host": "127.0.0.1",
        "worker_urls": urls,
        "policy": policy,
        "disable_retries": True,
        "disable_circuit_breaker": True,
        "disable_tokenizer_autoload": True,
        "prometheus_host": "127.0.0.1",
        "prometheus_port": free_port(),
        "log_level": "warn",
    }
    args = [*peer_args(settings, ["launch"]), *extra_args]
    with run_server(
        SMG.module, args, log_dir=log_dir, name="smg", health_path=SMG.health_path,
        env=OFFLINE_ENV, python=str(SMG.python),
    ) as server:  # fmt: skip
        yield server


def served_by(engine: ServerProcess) -> int:
    """Requests an engine finished (its `sglang:num_requests_total`)."""
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("sglang:num_requests_total")
        )
    )


@contextlib.contextmanager
def topology(
    name: str, replicas: int, log_dir: Path, front_args: Sequence[str] = ()
) -> Iterator[tuple[str, list[Replica], str]]:
    """(URL the client sends to, the replicas, the routing-key mode); `front_args` go to
    topology B's front proxy."""
    token = secrets.token_hex(16)
    with contextlib.ExitStack() as stack:
        if name == "single":
            one = stack.enter_context(replica(log_dir, True, token))
            yield one.url, [one], "none"
            return
        kind, policy = name.split("-", 1)
        sidecar = kind == "A"
        nodes = [stack.enter_context(replica(log_dir, sidecar, token)) for _ in range(replicas)]
        smg_policy = "consistent_hashing" if policy in KEY_MODES else policy
        front = stack.enter_context(gateway([n.url for n in nodes], smg_policy, log_dir))
        if sidecar:
            yield front.url, nodes, KEY_MODES.get(policy, "none")
            return
        controls = ",".join(n.control_url for n in nodes)  # every replica's DART
        # the engines serve builtin; a gateway may not route the check (then unverified)
        settings = {"backend": front.url, "tokenizer": "builtin", "log_level": "warning"}
        serve = [*proxy_args({**settings, "control_url": controls}), *front_args]
        proxy = stack.enter_context(
            run_server("prism_proxy", serve, log_dir=log_dir, env={"PRISM_CONTROL_TOKEN": token})
        )
        yield proxy.url, nodes, "none"


def run_config(
    name: str,
    trace_path: Path,
    replicas: int,
    out: Path,
    max_replica_share: float = 0.4,
    front_args: Sequence[str] = (),
) -> dict[str, Any]:
    from loadgen.clients.replay import ReplayConfig, replay, write_results
    from loadgen.workloads.trace_format import read_trace

    trace = read_trace(trace_path)
    log_dir = out / "logs" / name
    log_dir.mkdir(parents=True, exist_ok=True)
    with topology(name, replicas, log_dir, front_args) as (url, nodes, routing_key):
        config = ReplayConfig(
            target=url, api="prism", routing_key=routing_key, max_replica_share=max_replica_share
        )
        results = asyncio.run(replay(trace, config))
        counts = [served_by(node.engine) for node in nodes]
    results["scale_out"] = {"config": name, "replicas": len(nodes), "served": counts}
    write_results(out / "results" / f"{name}_{trace_path.stem}.json", results)
    return results


def row(name: str, qps: float, results: dict[str, Any]) -> str:
    summary, counts = results["summary"], results["scale_out"]["served"]
    total = sum(counts) or 1
    share = max(counts) / total
    return (
        f"| {name} | {qps:g} | {100 * summary['hit_rate']:.1f} % | "
        f"{summary['p99_ttft_ms'] / 1e3:.2f} s | {summary['mean_ttft_ms'] / 1e3:.2f} s | "
        f"{'/'.join(map(str, counts))} | {100 * share:.0f} % | {summary['failed']} |"
    )


def brief(results: dict[str, Any]) -> dict[str, Any]:
    """What a configuration's run gives the table, for summaries.json."""
    summary = results["summary"]
    names = ("completed", "failed", "hit_rate", "p99_ttft_ms", "mean_ttft_ms")
    return {
        "served": results["scale_out"]["served"],
        **{name: summary.get(name) for name in (*names, "median_ttft_ms", "request_throughput")},
    }


def build_parser() -> argparse.ArgumentParser:
    """The options of `prism-loadgen scale-out`."""
    parser = argparse.ArgumentParser(
        prog="prism-loadgen scale-out",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--qps", default="40,120")
    parser.add_argument("--num-requests", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"also: {', '.join(EXTRA_CONFIGS)}"
    )
    parser.add_argument(
        "--max-replica-share", type=float, default=0.4, help="A-key-bounded's cap (default 0.4)"
    )
    parser.add_argument(
        "--front-proxy-arg",
        action="append",
        default=[],
        help="a flag for topology B's front proxy, e.g. --front-proxy-arg=--backend-replicas=1",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    from loadgen.workloads.rag_trace import RagTraceParams, build_rag_trace
    from loadgen.workloads.trace_format import write_trace
    from prism_tokens.tokenizer import load_tokenizer

    args = build_parser().parse_args(argv)
    out = Path(args.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer("builtin")
    lines = [
        "| configuration | QPS | hit | P99 TTFT | mean TTFT | served per replica "
        "| busiest replica | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summaries: dict[str, dict[str, Any]] = {}
    for qps in (float(q) for q in args.qps.split(",")):
        params = RagTraceParams(num_requests=args.num_requests, qps=qps)
        trace_path = out / "traces" / f"rag_n{args.num_requests}_qps{qps:g}.jsonl"
        if not trace_path.exists():
            header, requests = build_rag_trace(params, args.seed, tokenizer, "builtin")
            write_trace(trace_path, header, requests)
        for name in args.configs.split(","):
            results = run_config(
                name, trace_path, args.replicas, out, args.max_replica_share, args.front_proxy_arg
            )
            lines.append(row(name, qps, results))
            summaries[f"{name}_{trace_path.stem}"] = brief(results)
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    (out / "command.json").write_text(json.dumps({"argv": argv or []}, indent=1))
    document = {"argv": argv or [], "git_commit": git_commit(), "results": summaries}
    (out / "summaries.json").write_text(json.dumps(document, indent=1) + "\n")
    print(table)
    return 0
