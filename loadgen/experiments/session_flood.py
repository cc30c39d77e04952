"""Agent sessions that never return, beside a steady victim (issue 34).

    python -m loadgen.experiments.session_flood --engine sim|sglang --out DIR [--lines lru,dart]
        [--before-dir DIR] [--pool TOKENS] [--sessions 200] ...

A flood client opens `sessions` tool-calling chats (~`session_tokens` tokens each: one
agent type's system prompt and tools, then a user message of its own) at most
`concurrency` at a time and `rate_per_s` per second. Every answer ends in a tool call
(`tool_choice: "required"`: prism-sim's forced calls, the real model's constrained
ones), and no session is ever continued. Beside it a victim re-sends one chat (a long
system prompt and a question, no tools) every `victim_period_s`, from before the flood
starts until after it ends. Both go through the proxy, each from a loopback address of
its own (127.0.0.2 and 127.0.0.3: two clients to the proxy).

Reported per line, for the victim's calls before, during and after the flood: its
cached share (cached / prompt tokens, the first, cold call left out) and the share of
its reusable prefix (its system turn) that was cached. Lines:

    lru           the engine's LRU order behind the proxy (no control RPC)
    dart          DART with the proxy's control RPC: this checkout
    dart-before   the same from another checkout (`--before-dir`: e.g. an export of
                  the commit before a change), servers started there

Engines: `sim` is prism-sim (real time, `--pool` KV tokens); `sglang` is the real,
unmodified SGLang 0.5.23 on this CPU (`sglang_cpu.serve`, the tiny model, `--pool` as
`--max-total-tokens`, its tool calls as `SGLANG_TOOL_SETTINGS` says), started with
`--sglang-python`.
DART's `/prism/stats` is sampled every second: the most tokens it retained is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai

from loadgen.stack.processes import engine_args, proxy_args, run_server
from loadgen.workloads.textgen import random_text
from prism_tokens.tokenizer import Tokenizer, load_tokenizer

LINES = ("lru", "dart-before", "dart")
# SGLang's answer to `tool_choice: "required"` that a random-weight model can finish: the
# JSON array of calls constrained by the tools' schemas (`get_json_schema_constraint`,
# which prism-sim emulates), compact. The tiny model's own parser (qwen) constrains the
# call with a structural tag instead, which lets the random model run on to the token
# limit; a parser without structural tags (gemma4's) takes the JSON path, and the chat is
# still rendered by the model's own template.
SGLANG_TOOL_SETTINGS = {
    "tool_call_parser": "gemma4",
    "constrained_json_disable_any_whitespace": True,
}
FLOOD_ADDRESS = "127.0.0.2"
VICTIM_ADDRESS = "127.0.0.3"
AGENT_SYSTEM = (
    "You are the support agent of a parcel company. Use the tools to look up parcels "
    "and open claims; never guess a parcel's state."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "track_parcel",
            "description": "The state of a parcel.",
            "parameters": {
                "type": "object",
                "properties": {"region": {"type": "string", "enum": ["north", "south"]}},
                "required": ["region"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "open_claim",
            "description": "Open a claim for a damaged parcel.",
            "parameters": {
                "type": "object",
                "properties": {"urgent": {"type": "boolean"}},
                "required": ["urgent"],
                "additionalProperties": False,
            },
        },
    },
]
VICTIM_QUESTION = "Which rule above applies to a late parcel? Answer in one word."
VICTIM_SHAPES = {
    "system": "a system prompt and a question; reusable prefix: the system turn",
    "user": "one user message, a private piece; reusable prefix: all but the question",
    "completion": "a /v1/completions prompt; reusable prefix: all but the question",
}


@dataclass(frozen=True)
class FloodConfig:
    sessions: int = 200
    concurrency: int = 8
    rate_per_s: float = 3.0
    session_tokens: int = 1200
    flood_max_tokens: int = 64
    victim_tokens: int = 1000  # the victim's system prompt
    victim_period_s: float = 0.5
    # system: a long system prompt and a question (its reusable prefix is the system
    # turn); user: the same text as one user message (a chat of one private piece);
    # completion: the text as a `/v1/completions` prompt
    victim: str = "system"
    before_s: float = 15.0
    after_s: float = 20.0
    seed: int = 0
    timeout_s: float = 300.0


@dataclass
class Call:
    sent: float  # seconds since the clients started
    end: float = 0.0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    tool_call: bool = False
    error: str | None = None


@dataclass
class ClientRecords:
    victim: list[Call] = field(default_factory=list)
    flood: list[Call] = field(default_factory=list)
    flood_start: float = 0.0
    flood_end: float = 0.0


def _client(url: str, address: str, timeout_s: float) -> openai.AsyncOpenAI:
    transport = httpx.AsyncHTTPTransport(local_address=address)
    http = httpx.AsyncClient(transport=transport, timeout=timeout_s)
    return openai.AsyncOpenAI(
        base_url=url.rstrip("/") + "/v1", api_key="unused", http_client=http, max_retries=0
    )


def flood_messages(tokenizer: Tokenizer, config: FloodConfig) -> list[list[dict[str, str]]]:
    """Each flood session's messages: the shared agent system prompt, then a user message
    of its own sized so the rendered prompt is about `session_tokens`."""
    rng = np.random.default_rng(config.seed)
    base = [{"role": "system", "content": AGENT_SYSTEM}]
    rendered = tokenizer.render_chat(
        [*base, {"role": "user", "content": "x"}], add_generation_prompt=True, tools=TOOLS
    )
    room = max(16, config.session_tokens - len(tokenizer.encode(rendered)))
    return [
        [*base, {"role": "user", "content": f"Case {n}. {random_text(tokenizer, rng, room)}"}]
        for n in range(config.sessions)
    ]


def victim_messages(tokenizer: Tokenizer, config: FloodConfig) -> list[dict[str, str]]:
    rng = np.random.default_rng(config.seed + 1)
    system = "Rules of the desk. " + random_text(tokenizer, rng, config.victim_tokens)
    if config.victim == "system":
        return [{"role": "system", "content": system}, {"role": "user", "content": VICTIM_QUESTION}]
    return [{"role": "user", "content": f"{system}\n\n{VICTIM_QUESTION}"}]


def prefix_tokens(tokenizer: Tokenizer, config: FloodConfig) -> int:
    """Tokens of the victim's reusable prefix: the chat rendered up to its system turn
    (shape `system`), else its whole prompt less the question."""
    messages = victim_messages(tokenizer, config)
    if config.victim == "system":
        text = tokenizer.render_chat(messages[:1], add_generation_prompt=False)
        return len(tokenizer.encode(text))
    return len(tokenizer.encode(messages[0]["content"])) - len(tokenizer.encode(VICTIM_QUESTION))


async def _victim(
    client: openai.AsyncOpenAI,
    messages: list[dict[str, str]],
    config: FloodConfig,
    started: float,
    stop: asyncio.Event,
    calls: list[Call],
) -> None:
    period = config.victim_period_s
    while not stop.is_set():
        # the next tick: one that passed during a slow call is skipped, not made up
        await asyncio.sleep(period - (time.monotonic() - started) % period)
        call = Call(time.monotonic() - started)
        calls.append(call)
        try:
            if config.victim == "completion":
                usage = (
                    await client.completions.create(
                        model="m", prompt=messages[0]["content"], max_tokens=4, temperature=0
                    )
                ).usage
            else:
                answer = await client.chat.completions.create(
                    model="m",
                    messages=messages,
                    max_tokens=4,
                    temperature=0,  # type: ignore[arg-type]
                )
                usage = answer.usage
            if usage is not None:
                call.prompt_tokens = usage.prompt_tokens
                details = usage.prompt_tokens_details
                call.cached_tokens = details.cached_tokens if details else 0
        except openai.OpenAIError as exc:
            call.error = f"{type(exc).__name__}: {exc}"[:300]
        call.end = time.monotonic() - started


async def _flood_session(
    client: openai.AsyncOpenAI, messages: list[dict[str, str]], config: FloodConfig, call: Call
) -> None:
    try:
        answer = await client.chat.completions.create(
            model="m",
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=config.flood_max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in answer:
            if chunk.usage is not None:
                call.prompt_tokens = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                call.cached_tokens = details.cached_tokens if details else 0
            for part in chunk.choices:
                call.tool_call = call.tool_call or part.finish_reason == "tool_calls"
    except openai.OpenAIError as exc:
        call.error = f"{type(exc).__name__}: {exc}"[:300]


async def run_clients(url: str, tokenizer: Tokenizer, config: FloodConfig) -> ClientRecords:
    """The victim from the start; the flood after `before_s`; the victim until `after_s`
    after the flood's last answer."""
    records = ClientRecords()
    victim_chat = victim_messages(tokenizer, config)
    sessions = flood_messages(tokenizer, config)
    victim = _client(url, VICTIM_ADDRESS, config.timeout_s)
    flood = _client(url, FLOOD_ADDRESS, config.timeout_s)
    started = time.monotonic()
    stop = asyncio.Event()
    victim_task = asyncio.create_task(
        _victim(victim, victim_chat, config, started, stop, records.victim)
    )
    try:
        await asyncio.sleep(config.before_s)
        records.flood_start = time.monotonic() - started
        slots = asyncio.Semaphore(config.concurrency)

        async def one(n: int) -> None:
            await asyncio.sleep(
                max(0.0, started + records.flood_start + n / config.rate_per_s - time.monotonic())
            )
            async with slots:
                call = Call(time.monotonic() - started)
                records.flood.append(call)
                await _flood_session(flood, sessions[n], config, call)
                call.end = time.monotonic() - started

        await asyncio.gather(*(one(n) for n in range(config.sessions)))
        records.flood_end = time.monotonic() - started
        await asyncio.sleep(config.after_s)
    finally:
        stop.set()
        await victim_task
        await victim.close()
        await flood.close()
    return records


def _share(calls: list[Call], prefix: int) -> dict[str, Any]:
    done = [c for c in calls if c.prompt_tokens and c.cached_tokens is not None]
    prompt = sum(c.prompt_tokens or 0 for c in done)
    cached = sum(c.cached_tokens or 0 for c in done)
    reused = sum(min(c.cached_tokens or 0, prefix) for c in done)
    return {
        "calls": len(calls),
        "errors": sum(c.error is not None for c in calls),
        "cached_share": round(cached / prompt, 4) if prompt else None,
        "prefix_share": round(reused / (prefix * len(done)), 4) if done else None,
    }


def summarize(records: ClientRecords, prefix: int) -> dict[str, Any]:
    """The victim's shares before, during and after the flood (its first call, which
    could not be cached, left out), and what the flood did."""
    victim = records.victim[1:]
    start, end = records.flood_start, records.flood_end
    flood = records.flood
    return {
        "victim_prefix_tokens": prefix,
        "victim_prompt_tokens": next((c.prompt_tokens for c in victim if c.prompt_tokens), None),
        "before": _share([c for c in victim if c.sent < start], prefix),
        "during": _share([c for c in victim if start <= c.sent < end], prefix),
        "after": _share([c for c in victim if c.sent >= end], prefix),
        "flood": {
            "sessions": len(flood),
            "tool_calls": sum(c.tool_call for c in flood),
            "errors": sum(c.error is not None for c in flood),
            "first_error": next((c.error for c in flood if c.error), None),
            "mean_prompt_tokens": round(
                float(np.mean([c.prompt_tokens for c in flood if c.prompt_tokens] or [0])), 1
            ),
            "seconds": round(end - start, 1),
        },
    }


# ---- the servers ---------------------------------------------------------------------
@dataclass(frozen=True)
class Stack:
    engine: str  # sim | sglang
    pool: int
    log_dir: Path
    sglang_python: str = sys.executable
    tokenizer: str = "builtin"  # the proxy's --tokenizer


class _StatsSampler:
    """DART's `/prism/stats` every second, in a thread (the clients own the loop)."""

    def __init__(self, control_url: str, token: str) -> None:
        self.url, self.token = control_url + "/prism/stats", token
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        while not self._stop.wait(1.0):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                self.samples.append(httpx.get(self.url, headers=headers, timeout=5.0).json())

    def __enter__(self) -> _StatsSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def stack(line: str, setup: Stack, code: Path | None) -> Iterator[tuple[str, _StatsSampler | None]]:
    """Engine and proxy of `line`, run from `code` (None: this checkout); yields the
    proxy's URL and DART's stats sampler (None under LRU)."""
    token = secrets.token_hex(8)
    control_port = None if line == "lru" else _port()
    eviction = "lru" if line == "lru" else "dart"
    # The control token in the environment (never on a command line), read by the engine
    # (prism-sim, SGLang's DART plugin) and the proxy.
    env = {"PRISM_CONTROL_TOKEN": token, **({"PYTHONPATH": str(code)} if code is not None else {})}
    log_dir = setup.log_dir / line
    if setup.engine == "sim":
        module, python, startup = "prism_sim", sys.executable, 60.0
        settings = {"kv_capacity_tokens": setup.pool, "eviction": eviction}
        settings |= {"log_level": "warning", "control_port": control_port}
    else:
        module, python, startup = "sglang_cpu.serve", setup.sglang_python, 900.0
        settings = {"max_total_tokens": setup.pool, "eviction": eviction}
        settings |= {"sglang": SGLANG_TOOL_SETTINGS, "control_port": control_port}
    with run_server(
        module,
        engine_args(settings),
        log_dir=log_dir,
        name="engine",
        env=env,
        python=python,
        cwd=code,
        startup_timeout_s=startup,
    ) as engine:
        control_url = None if control_port is None else f"http://127.0.0.1:{control_port}"
        settings = {"backend": engine.url, "tokenizer": setup.tokenizer, "log_level": "warning"}
        serve = proxy_args({**settings, "control_url": control_url})
        with run_server(
            "prism_proxy", serve, log_dir=log_dir, name="proxy", env=env, cwd=code
        ) as proxy:
            if control_port is None:
                yield proxy.url, None
                return
            with _StatsSampler(f"http://127.0.0.1:{control_port}", token) as sampler:
                yield proxy.url, sampler


def _port() -> int:
    from loadgen.stack.processes import free_port

    return free_port()


def run_line(
    line: str, setup: Stack, config: FloodConfig, tokenizer: Tokenizer, code: Path | None
) -> dict[str, Any]:
    began = time.monotonic()
    with stack(line, setup, code) as (url, sampler):
        records = asyncio.run(run_clients(url, tokenizer, config))
    prefix = prefix_tokens(tokenizer, config)
    result = {
        "line": line,
        "engine": setup.engine,
        "pool": setup.pool,
        **summarize(records, prefix),
        "wall_s": round(time.monotonic() - began, 1),
    }
    if sampler is not None and sampler.samples:
        result["dart_most_retained_tokens"] = max(
            s.get("retained_tokens", 0) for s in sampler.samples
        )
        result["dart_most_retained"] = max(s.get("retained", 0) for s in sampler.samples)
        result["dart_evicted_tokens"] = sampler.samples[-1].get("evicted_tokens")
    return result


# ---- report --------------------------------------------------------------------------
def report(results: list[dict[str, Any]], command: str, commit: str, victim: str) -> str:
    rows = [
        "| line | before | during | after | during, prefix | flood tool calls "
        "| DART most retained |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        retained = r.get("dart_most_retained_tokens")
        rows.append(
            f"| {r['line']} | {r['before']['cached_share']} | **{r['during']['cached_share']}** "
            f"| {r['after']['cached_share']} | {r['during']['prefix_share']} "
            f"| {r['flood']['tool_calls']}/{r['flood']['sessions']} "
            f"| {'' if retained is None else f'{retained:,} tokens'} |"
        )
    first = results[0]
    return "\n".join(
        [
            f"# Sessions that never return beside a steady victim ({first['engine']})",
            "",
            f"`{command}` at {commit}",
            "",
            f"Pool {first['pool']:,} KV tokens; the victim's prompt (`{victim}`: "
            f"{VICTIM_SHAPES[victim]}) {first['victim_prompt_tokens']} tokens, its "
            f"reusable prefix {first['victim_prefix_tokens']}; the flood's prompts "
            f"{first['flood']['mean_prompt_tokens']} tokens on average, over "
            f"{first['flood']['seconds']} s. Victim's cached share (cached / prompt tokens):",
            "",
            *rows,
            "",
        ]
    )


def _commit() -> str:
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return out.stdout.strip() + ("+dirty" if dirty.strip() else "")
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadgen.experiments.session_flood",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--engine", choices=("sim", "sglang"), default="sim")
    parser.add_argument("--out", required=True)
    parser.add_argument("--lines", default="lru,dart")
    parser.add_argument("--before-dir", default=None, help="checkout the dart-before line runs")
    parser.add_argument("--pool", type=int, default=24000, help="KV tokens")
    parser.add_argument("--sglang-python", default=sys.executable)
    for name, value in asdict(FloodConfig()).items():
        if name == "victim":
            parser.add_argument("--victim", choices=tuple(VICTIM_SHAPES), default=value)
            continue
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = parser.parse_args(argv)
    lines = args.lines.split(",")
    unknown = set(lines) - set(LINES)
    if unknown or ("dart-before" in lines and not args.before_dir):
        parser.error(f"lines: {', '.join(LINES)} (dart-before needs --before-dir)")
    config = FloodConfig(**{k: getattr(args, k) for k in asdict(FloodConfig())})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.engine == "sglang":
        from sglang_cpu.model import ensure_tiny_model

        tokenizer_spec = str(ensure_tiny_model())
    else:
        tokenizer_spec = "builtin"
    tokenizer = load_tokenizer(tokenizer_spec)
    setup = Stack(args.engine, args.pool, out / "logs", args.sglang_python, tokenizer_spec)
    results = []
    for line in lines:
        code = Path(args.before_dir).resolve() if line == "dart-before" else None
        result = run_line(line, setup, config, tokenizer, code)
        print(json.dumps(result), flush=True)
        results.append(result)
    command = "python -m loadgen.experiments.session_flood " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    commit = _commit()
    (out / "results.json").write_text(
        json.dumps(
            {"command": command, "commit": commit, "config": asdict(config), "results": results},
            indent=1,
        )
        + "\n"
    )
    (out / "report.md").write_text(report(results, command, commit, config.victim))
    print(f"wrote {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
