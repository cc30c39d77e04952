"""`prism-sim` / `python -m prism_sim`: run the simulated SGLang engine (SPEC §7)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prism_sim.eviction import eviction_strategy_names
from prism_sim.extensions import EXTENSION_MODULES
from prism_sim.host_tier import (
    DEFAULT_HICACHE_BANDWIDTH_GBPS,
    DEFAULT_HICACHE_RATIO,
    WRITE_POLICIES,
)
from prism_sim.schedule_policy import POLICIES
from prism_sim.time_model import DEFAULT_PROFILE
from prism_wire.secret import read_secret

if TYPE_CHECKING:
    from prism_sim.engine import SimConfig, SimEngine

log = logging.getLogger("prism_sim")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prism-sim", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tokenizer", default=None, help="model directory (default: builtin)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="profile name or JSON path")
    p.add_argument("--kv-capacity-tokens", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None, help="-1 disables")
    p.add_argument("--schedule-policy", choices=POLICIES, default="fcfs")
    p.add_argument(
        "--eviction",
        "--radix-eviction-policy",
        dest="eviction",
        default="lru",
        help="radix eviction order: SGLang's lru, lfu, fifo, mru, filo, priority, slru, "
        "tlru, or an extension (dart, lru+active)",
    )
    p.add_argument(
        "--radix-eviction-policy-config",
        type=json.loads,
        default=None,
        help="keyword arguments of the eviction policy as a JSON object, as in SGLang: "
        'slru {"protected_threshold": 2}; tlru {"threshold": T, "next_prompt_estimate": Q} '
        "(tokens, T > Q)",
    )
    p.add_argument("--speed", type=float, default=1.0, help="time scale; 1.0 = real time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--incremental-streaming-output", action="store_true")
    p.add_argument("--control-port", type=int, default=None)
    p.add_argument(
        "--protect-fraction",
        type=float,
        default=None,
        help="DART: most of the KV pool the protected set may hold, in [0, 1] "
        "(default: PRISM_DART_PROTECT_FRACTION, else 0.25)",
    )
    p.add_argument(
        "--answer-text",
        default=None,
        help="chat answers that call no tool: this text then the stop token (default: "
        "filler up to the request's max tokens)",
    )
    p.add_argument(
        "--enable-hierarchical-cache",
        "--enable-hicache",
        action="store_true",
        help="SGLang's host-memory KV tier: write-through copies, loaded back over PCIe",
    )
    p.add_argument(
        "--hicache-ratio",
        type=float,
        default=DEFAULT_HICACHE_RATIO,
        help="host pool size as a multiple of the device pool (SGLang's default 2.0)",
    )
    p.add_argument(
        "--hicache-size",
        type=float,
        default=0.0,
        help="host pool size in GB; overrides --hicache-ratio when > 0",
    )
    p.add_argument(
        "--hicache-write-policy",
        choices=WRITE_POLICIES,
        default="write_through",
        help="when nodes are copied to host (only SGLang's default is modeled)",
    )
    p.add_argument(
        "--hicache-bandwidth-gbps",
        type=float,
        default=DEFAULT_HICACHE_BANDWIDTH_GBPS,
        help="host→device copy rate in GB/s (default: PCIe 4.0 x16, pinned copies)",
    )
    p.add_argument("--log-level", default="info")
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    from prism_sim.engine import SimConfig  # lazy: `--help` need not load the tokenizer stack

    return SimConfig(
        host=args.host,
        port=args.port,
        tokenizer=args.tokenizer,
        profile=args.profile,
        kv_capacity_tokens=args.kv_capacity_tokens,
        max_running_requests=args.max_running_requests,
        chunked_prefill_size=args.chunked_prefill_size,
        schedule_policy=args.schedule_policy,
        eviction=args.eviction,
        radix_eviction_policy_config=args.radix_eviction_policy_config,
        speed=args.speed,
        seed=args.seed,
        served_model_name=args.served_model_name,
        incremental_streaming_output=args.incremental_streaming_output,
        control_port=args.control_port,
        control_token=read_secret(os.environ, "PRISM_CONTROL_TOKEN"),
        protect_fraction=args.protect_fraction,
        answer_text=args.answer_text,
        api_key=read_secret(os.environ, "PRISM_ENGINE_API_KEY"),
        enable_hierarchical_cache=args.enable_hierarchical_cache,
        hicache_ratio=args.hicache_ratio,
        hicache_size=args.hicache_size,
        hicache_write_policy=args.hicache_write_policy,
        hicache_bandwidth_gbps=args.hicache_bandwidth_gbps,
    )


async def serve(config: SimConfig, engine: SimEngine) -> None:
    from prism_sim.server import create_app, start_site

    app = create_app(config, engine)
    runner = await start_site(app, config.host, config.port)
    log.info("prism-sim listening on http://%s:%d", config.host, config.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info(
            "prism-sim stopping: aborting %d live requests", len(engine.scheduler.live_requests())
        )
    finally:
        await runner.cleanup()
        log.info("prism-sim stopped")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    known = {*eviction_strategy_names(), *EXTENSION_MODULES}
    if args.eviction.lower() not in known:
        print(f"prism-sim: unknown --eviction {args.eviction!r} (known: {sorted(known)})",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.control_port is not None and args.eviction.lower() not in EXTENSION_MODULES:
        print(f"prism-sim: --control-port serves DART's control RPC: it needs --eviction "
              f"{' or '.join(sorted(EXTENSION_MODULES))}", file=sys.stderr)  # fmt: skip
        return 2
    try:
        config = config_from_args(args)
        from prism_sim.engine import SimEngine

        engine = SimEngine(config)  # profile, tokenizer and control settings checked here
    except (ValueError, FileNotFoundError) as exc:  # a `SecretError` too: a bad PRISM_*_FILE
        print(f"prism-sim: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.run(serve(config, engine))
    except ImportError:
        asyncio.run(serve(config, engine))
    return 0
