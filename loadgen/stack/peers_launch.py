"""The peer gateways of the side-by-side benchmark: how to start each one as a
plain pass-through in front of one SGLang-compatible backend.

`make peers` installs each peer, pinned, in its own venv `.venv-peers/<name>/`
(bench/peer-requirements/<name>.txt); `installed_peers()` lists those whose venv is
there and whose code imports. `start_peer(peer, backend_url)` runs one until the block
exits, ready (its readiness path answers 200) before the block starts.

    python -m loadgen.stack.peers_launch          # prism-sim, then each installed peer in front
                                          # of it, one request of each kind through it

Findings per peer (endpoints, flags, what they probe on the worker): bench/PEERS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from loadgen.stack.peer_lines import (
    CONTEXTPILOT_MODULE,
    CONTEXTPILOT_VERSION,
    HOST,
    OFFLINE_ENV,
    PEERS_DIR,
    contextpilot_args,
)
from loadgen.stack.processes import ServerProcess, engine_args, free_port, peer_args, run_server


@dataclasses.dataclass(frozen=True)
class Peer:
    """One peer gateway: its venv, its module and the flags that make it a pass-through."""

    name: str
    version: str
    module: str  # run as `<venv>/bin/python -m <module> <args> --port P`
    import_check: str  # `python -c` this to prove the install (and its binary) loads
    health_path: str  # 200 once it can route to the backend
    needs_model: bool  # OpenAI requests must name a model the peer knows
    # The client endpoints it forwards; the others answer 404 or fail (bench/PEERS.md).
    endpoints: frozenset[str]
    # True: the router's own defaults (cache_aware, retries, circuit breaker, load polling)
    # instead of the pass-through flags; ContextPilot has no such flags.
    defaults: bool = False

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}" + (" (defaults)" if self.defaults else "")

    @property
    def venv(self) -> Path:
        return PEERS_DIR / self.name

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def args(self, backend_url: str, *, served_model: str | None, client_model: str | None):
        """The arguments after `-m <module>` (the port is appended by `run_server`)."""
        raise NotImplementedError

    def runs(self, timeout_s: float = 60.0) -> bool:
        """True when the venv exists and its code imports."""
        if not self.python.exists():
            return False
        try:
            done = subprocess.run(
                [str(self.python), "-c", self.import_check],
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0


ALL_ENDPOINTS = frozenset(
    {"chat", "chat_stream", "completions", "completions_stream", "generate", "generate_stream"}
)


@dataclasses.dataclass(frozen=True)
class Smg(Peer):
    """Shepherd Model Gateway (sgl-model-gateway), Rust. Default policy is cache_aware with
    retries, a circuit breaker and a load monitor polling the worker every 10 s; here
    round_robin, no retries (the body then streams to the worker verbatim instead of being
    buffered for a retry), no breaker, no admission bound, load polling off, no tokenizer."""

    name: str = "smg"
    version: str = "1.13.0"
    module: str = "smg"
    import_check: str = "import smg.smg_rs, smg.launch_router"
    health_path: str = "/readiness"
    needs_model: bool = True
    endpoints: frozenset[str] = ALL_ENDPOINTS

    def args(self, backend_url, *, served_model=None, client_model=None):
        settings: dict[str, Any] = {
            "host": HOST,
            "worker_urls": [backend_url],
            "disable_tokenizer_autoload": True,
            "prometheus_host": HOST,
            "prometheus_port": free_port(),
            "log_level": "warn",
        }
        if not self.defaults:
            settings |= {
                "policy": "round_robin",
                "disable_retries": True,
                "disable_circuit_breaker": True,
                "disable_load_monitoring": True,
                "load_monitor_interval": 3600,
                "max_concurrent_requests": 0,
            }
        if client_model and served_model and client_model != served_model:
            settings["model_alias"] = f"{client_model}={served_model}"
        return peer_args(settings, ["launch"])


@dataclasses.dataclass(frozen=True)
class SglangRouter(Peer):
    """The older SGLang router (0.3.x), Rust. It parses and re-serializes every body and
    logs each request at info; here round_robin, no retries, no breaker, warn logs."""

    name: str = "sglang-router"
    version: str = "0.3.2"
    module: str = "sglang_router.launch_router"
    import_check: str = "import sglang_router.sglang_router_rs, sglang_router.launch_router"
    health_path: str = "/readiness"
    needs_model: bool = False
    endpoints: frozenset[str] = ALL_ENDPOINTS

    def args(self, backend_url, *, served_model=None, client_model=None):
        settings: dict[str, Any] = {
            "host": HOST,
            "worker_urls": [backend_url],
            "prometheus_host": HOST,
            "prometheus_port": free_port(),
            "log_level": "warn",
        }
        if not self.defaults:
            settings |= {
                "policy": "round_robin",
                "disable_retries": True,
                "disable_circuit_breaker": True,
            }
        return peer_args(settings)


@dataclasses.dataclass(frozen=True)
class ContextPilot(Peer):
    """ContextPilot's HTTP server (FastAPI on uvicorn/uvloop, aiohttp to the backend).
    It forwards /v1/* only: no native /generate, and a streamed /v1/completions fails
    (502: it reads the SSE answer as JSON). /health is 503 until POST /reorder, so
    readiness is `/`. Its per-request info logs are off at --log-level warning."""

    name: str = "contextpilot"
    version: str = CONTEXTPILOT_VERSION
    module: str = CONTEXTPILOT_MODULE
    import_check: str = f"import {CONTEXTPILOT_MODULE}"
    health_path: str = "/"
    needs_model: bool = False
    endpoints: frozenset[str] = frozenset({"chat", "chat_stream", "completions"})

    def args(self, backend_url, *, served_model=None, client_model=None):
        return contextpilot_args(backend_url)  # the sweep's contextpilot-real runs it too


PEERS: tuple[Peer, ...] = (Smg(), SglangRouter(), ContextPilot())


def installed_peers() -> list[Peer]:
    """The peers whose venv exists and whose code imports (see `make peers`)."""
    return [peer for peer in PEERS if peer.runs()]


def with_defaults(peer: Peer) -> Peer:
    """The same peer started with its own routing defaults (see `Peer.defaults`)."""
    return dataclasses.replace(peer, defaults=True)


def served_model(backend_url: str) -> str:
    """The backend's model name (its first `/v1/models` entry)."""
    response = httpx.get(backend_url + "/v1/models", timeout=10.0)
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


@contextlib.contextmanager
def start_peer(
    peer: Peer,
    backend_url: str,
    *,
    client_model: str | None = None,
    port: int | None = None,
    log_dir: Path | None = None,
    startup_timeout_s: float = 60.0,
) -> Iterator[ServerProcess]:
    """Run `peer` in front of `backend_url` until the block exits.

    `client_model` is the model name the clients will send; a peer that routes by model
    (smg) is told it is an alias of the backend's own name.
    """
    served = served_model(backend_url) if peer.needs_model and client_model else None
    with run_server(
        peer.module,
        peer.args(backend_url, served_model=served, client_model=client_model),
        port=port,
        log_dir=log_dir,
        name=f"peer-{peer.name}",
        health_path=peer.health_path,
        startup_timeout_s=startup_timeout_s,
        env=OFFLINE_ENV,
        python=str(peer.python),
    ) as server:
        yield server


# --- one request of each kind through a peer (python -m loadgen.stack.peers_launch) ---


def _sse_events(text: str) -> list[str]:
    return [line[len("data:") :].strip() for line in text.splitlines() if line.startswith("data:")]


def _check_answer(kind: str, response: httpx.Response) -> str:
    """Either "ok" or why not."""
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {response.text[:120]}"
    try:
        if kind.endswith("_stream"):
            events = _sse_events(response.text)
            if not events or events[-1] != "[DONE]":
                return f"stream without [DONE] ({len(events)} events)"
            chunks = [json.loads(event) for event in events[:-1]]
            if kind == "generate_stream":
                text = chunks[-1]["text"]
            elif kind == "chat_stream":
                text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            else:
                text = "".join(c["choices"][0].get("text") or "" for c in chunks)
        else:
            body = response.json()
            if kind == "generate":
                text = body["text"]
            elif kind == "chat":
                text = body["choices"][0]["message"]["content"]
            else:
                text = body["choices"][0]["text"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return f"unexpected answer ({exc!r}): {response.text[:120]}"
    return "ok" if text else "empty answer"


def check_endpoints(url: str, model: str, max_tokens: int = 8) -> dict[str, str]:
    """Send one request of each kind to `url`; each kind maps to "ok" or why not."""
    messages = [{"role": "user", "content": "Say something short."}]
    requests = {
        "chat": ("/v1/chat/completions", {"model": model, "messages": messages}),
        "completions": ("/v1/completions", {"model": model, "prompt": "Say something."}),
        "generate": ("/generate", {"text": "Say something.", "sampling_params": {}}),
    }
    results = {}
    with httpx.Client(timeout=30.0) as client:
        for kind, (path, body) in requests.items():
            for stream in (False, True):
                payload = dict(body, stream=stream)
                if kind == "generate":
                    payload["sampling_params"] = {"max_new_tokens": max_tokens}
                else:
                    payload["max_tokens"] = max_tokens
                name = kind + ("_stream" if stream else "")
                try:
                    results[name] = _check_answer(name, client.post(url + path, json=payload))
                except httpx.HTTPError as exc:
                    results[name] = repr(exc)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="m", help="the model name clients send")
    parser.add_argument("--speed", default="50", help="prism-sim --speed")
    args = parser.parse_args(argv)
    peers = installed_peers()
    missing = [peer.name for peer in PEERS if peer not in peers]
    if missing:
        print(f"not installed (make peers): {', '.join(missing)}")
    failures = 0
    with (
        tempfile.TemporaryDirectory(prefix="peers-") as tmp,
        run_server("prism_sim", engine_args({"speed": args.speed}), log_dir=Path(tmp)) as sim,
    ):
        for peer in peers:
            with start_peer(peer, sim.url, client_model=args.model, log_dir=Path(tmp)) as srv:
                results = check_endpoints(srv.url, args.model)
            for kind, result in results.items():
                expected = kind in peer.endpoints
                failures += (result == "ok") != expected
                if result == "ok":
                    mark = "ok"
                else:
                    mark = f"{'unsupported' if not expected else 'FAILS'} ({result[:100]})"
                note = "" if (result == "ok") == expected else "  <-- not as documented"
                print(f"{peer.label} {kind}: {mark}{note}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
