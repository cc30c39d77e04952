"""Start and stop the project's servers as real subprocesses on loopback: the launcher.

Used by the sweep, the demo, the benchmarks and the integration tests, so that all of
them exercise the same console entry points over real HTTP.

This is the one module that spells the servers' flags, the peers' included. Everyone
else names settings: `proxy_args({"policy": "prism", "window_ms": 10})` is the proxy's
command line (its flags where it has one, `--set KEY=VALUE` otherwise),
`engine_args({"speed": 4, "sglang": {"schedule_policy": "lpm"}})` that of prism-sim or
`sglang_cpu.serve` (each key as its `--key`, `sglang` as SGLang's own flags through
`--sglang-arg`), `peer_args({"worker_urls": [url], "policy": "round_robin"}, ["launch"])`
that of a third party's gateway or server (smg, sglang-router, ContextPilot). A line of
an experiment is written `name[key=value;...]` and read by `parse_line`.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Ports our servers listen on: below Linux's ephemeral range (32768-60999), which the OS
# hands to outgoing connections, and outside 22000-29999, where SGLang 0.5.23 draws the
# NCCL port that each of its servers binds on 0.0.0.0 while it starts
# (`get_free_port_below_ephemeral`): a server of ours on such a port lost it to another
# SGLang's TCPStore now and then.
SERVER_PORTS = (*range(20000, 22000), *range(30000, 32768))
# A port handed out is not handed out again by this process for this long: a server
# may take seconds to bind the port it was given.
REUSE_AFTER_S = 300.0
_handed_out: dict[int, float] = {}


def setting_text(value: Any) -> str:
    """A setting's value on a command line: floats without trailing zeros, booleans as
    `true`/`false` (both servers parse these)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def proxy_args(settings: Mapping[str, Any]) -> list[str]:
    """`prism-proxy serve` with `settings` (keys as in the proxy's config file or its
    `ProxyConfig` field names: `policy`, `qas`, `window_ms`, `q_cold`, ...; None left
    out). A setting with a flag of its own (`prism_proxy.options.FLAGS`) is given by it,
    any other as `--set KEY=VALUE`, as an older checkout's proxy reads them too."""
    from prism_proxy.options import FLAGS, options

    flag_of = {}
    for option in options():
        if option.name in FLAGS:
            flag_of[option.key] = flag_of[option.name] = option.flag
    args = ["serve"]
    for key, value in settings.items():
        if value is None:
            continue
        flag = flag_of.get(key)
        text = setting_text(value)
        args += [flag, text] if flag else ["--set", f"{key}={text}"]
    return args


def engine_args(settings: Mapping[str, Any]) -> list[str]:
    """The command line of prism-sim or `sglang_cpu.serve`: each setting as `--key value`
    (underscores as dashes; True a bare flag; None and False left out). The key `sglang`
    holds SGLang's own settings, each passed as one `--sglang-arg=--key value`."""
    args: list[str] = []
    for key, value in settings.items():
        if key == "sglang":
            args += [f"--sglang-arg={' '.join(flag)}" for flag in _flags(value)]
        else:
            args += [token for flag in _flags({key: value}) for token in flag]
    return args


def peer_args(settings: Mapping[str, Any], command: Sequence[str] = ()) -> list[str]:
    """The command line of a third party's gateway or server (smg, sglang-router,
    ContextPilot): `command` (a subcommand, such as smg's `launch`), then each setting as
    `--key value` (underscores as dashes; True a bare flag; a list the flag and each of
    its values; None and False left out)."""
    return [*command, *(token for flag in _flags(settings) for token in flag)]


def _flags(settings: Mapping[str, Any]) -> list[list[str]]:
    """Each setting as its flag and value (a bare flag for True; a list's values after
    one flag; None/False: none)."""
    flags: list[list[str]] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append([flag])
        elif isinstance(value, list | tuple):
            flags.append([flag, *map(setting_text, value)])
        elif value is not None and value is not False:
            flags.append([flag, setting_text(value)])
    return flags


def parse_line(spec: str) -> tuple[str, dict[str, str]]:
    """A line of an experiment, `name` or `name[key=value;...]`: its name and settings
    (`prism[prefill_batch=16;q_cold=4]` -> ("prism", {"prefill_batch": "16", "q_cold": "4"})).
    ValueError on a malformed spec."""
    name, bracket, inner = spec.partition("[")
    if bracket and not inner.endswith("]"):
        raise ValueError(f"line {spec!r}: expected name[key=value;...]")
    return name.strip(), parse_settings(inner.removesuffix("]").split(";"))


def parse_settings(pairs: Iterable[str]) -> dict[str, str]:
    """`key=value` pairs (empty ones skipped) as settings; ValueError on one without `=`."""
    settings: dict[str, str] = {}
    for pair in filter(None, pairs):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{pair!r} is not key=value")
        settings[key.strip()] = value.strip()
    return settings


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, drawn from `SERVER_PORTS` and not handed
    out by this process in the last `REUSE_AFTER_S`."""
    rng = random.SystemRandom()
    now = time.monotonic()
    for port in [p for p, at in _handed_out.items() if now - at > REUSE_AFTER_S]:
        del _handed_out[port]
    for _ in range(200):
        port = rng.choice(SERVER_PORTS)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out[port] = now
        return port
    raise OSError("no free port among SERVER_PORTS (20000-21999, 30000-32767)")


@dataclass
class ServerProcess:
    """A running server: its process, base URL and log file."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        return int(self.process.returncode)


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float, path: str) -> None:
    import httpx  # the loadgen extra (`prism-loadgen --help` runs without it)

    deadline = time.monotonic() + timeout_s
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with code {process.returncode} before {url}{path}")
        try:
            response = httpx.get(url + path, timeout=2.0)
            if response.status_code == 200:
                return
            last_error = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last_error = repr(exc)
        time.sleep(0.05)
    raise TimeoutError(f"{url}{path} not healthy after {timeout_s:.0f}s: {last_error}")


def spawn_server(
    module: str,
    args: Sequence[str],
    *,
    port: int | None = None,
    log_dir: Path | None = None,
    name: str | None = None,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    cwd: Path | None = None,
) -> ServerProcess:
    """Start `<python> -m <module> <args> --port P` (a free port when not given) with its
    output in a log file; returns at once (see `run_server` for waiting and stopping).
    `cwd`: where it runs, whose packages come first (another checkout's code)."""
    port = port or free_port()
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name or module.replace('.', '_')}-{port}.log"
    command = [python, "-m", module, *args, "--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
    return ServerProcess(process=process, url=f"http://127.0.0.1:{port}", log_path=log_path)


@contextlib.contextmanager
def run_server(
    module: str,
    args: Sequence[str],
    *,
    port: int | None = None,
    log_dir: Path | None = None,
    name: str | None = None,
    health_path: str = "/health",
    startup_timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    cwd: Path | None = None,
) -> Iterator[ServerProcess]:
    """Run `<python> -m <module> <args> --port P` until the block exits.

    The port is appended (free one when not given); the server must answer 200 on
    `health_path` before the block starts. Output goes to a log file.
    """
    server = spawn_server(
        module, args, port=port, log_dir=log_dir, name=name, env=env, python=python, cwd=cwd
    )
    try:
        wait_healthy(server.url, server.process, startup_timeout_s, health_path)
        yield server
    except BaseException:
        server.stop()
        sys.stderr.write(server.log_text()[-4000:])
        raise
    else:
        server.stop()
