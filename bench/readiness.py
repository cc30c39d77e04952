"""How fast the proxy's /readyz follows the engine: dying, and coming back.

    python -m bench.readiness [--cycles 5] [--engine sim|sglang]

Starts the engine (prism-sim, or with `--engine sglang` a real SGLang 0.5.23 on this
CPU: `sglang_cpu.serve`, the tiny model, its own radix cache, run by
`.venv-sglang`'s Python) and `prism-proxy serve` (real subprocesses, default settings:
the readiness probe every `ready_interval_s` = 1 s; the engine's tokenizer). Each
cycle: /readyz is 200; the engine is killed (SIGKILL, SGLang's whole process group);
the time until /readyz answers 503 is measured; a new engine process starts on the same
port; once it answers its own /health, the time until /readyz answers 200 (the proxy
checked its tokenizer against the new engine) is measured. /readyz is polled every
20 ms. Prints each cycle and the largest of each; no thresholds (issue 36's target:
both within 2 s). `PRISM_SGLANG_PYTHON`: SGLang's Python, if not `.venv-sglang`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

from loadgen.stack.processes import (
    ServerProcess,
    engine_args,
    free_port,
    proxy_args,
    run_server,
    spawn_server,
    wait_healthy,
)

POLL_S = 0.02
ROOT = Path(__file__).resolve().parent.parent
# engine -> (module, arguments, Python, start-up bound in seconds)
ENGINES = {
    "sim": ("prism_sim", engine_args({"speed": 50, "log_level": "warning"}), sys.executable, 60.0),
    "sglang": (
        "sglang_cpu.serve",
        engine_args({"eviction": "stock", "max_total_tokens": 4096}),
        str(ROOT / ".venv-sglang" / "bin" / "python"),
        600.0,
    ),
}


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def kill(engine: ServerProcess) -> None:
    """SIGKILL the engine, and the process groups its launcher started (SGLang's)."""
    for child in children(engine.process.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)
    engine.process.kill()
    engine.process.wait()


def until(client: httpx.Client, url: str, status: int, timeout_s: float = 60.0) -> float:
    """Poll `url` until it answers `status`; the time that took."""
    started = time.perf_counter()
    while True:
        try:
            if client.get(url, timeout=5.0).status_code == status:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"{url} did not answer {status} within {timeout_s:.0f} s")
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--engine", choices=tuple(ENGINES), default="sim")
    args = parser.parse_args(argv)
    module, engine_args, python, startup_s = ENGINES[args.engine]
    if args.engine == "sglang":
        python = os.environ.get("PRISM_SGLANG_PYTHON", python)
    logs = Path(tempfile.mkdtemp(prefix="prism-readiness-"))
    port = free_port()

    def start(cycle: int) -> ServerProcess:
        engine = spawn_server(
            module, engine_args, port=port, log_dir=logs, name=f"engine-{cycle}", python=python
        )
        try:
            wait_healthy(engine.url, engine.process, startup_s, "/health")
        except BaseException:
            kill(engine)
            raise
        return engine

    engine = start(0)
    try:
        serve = proxy_args({"backend": engine.url, "log_level": "warning"})
        with run_server("prism_proxy", serve, log_dir=logs) as proxy, httpx.Client() as http:
            readyz = proxy.url + "/readyz"
            downs, ups = [], []
            for cycle in range(1, args.cycles + 1):
                until(http, readyz, 200)
                killed = time.perf_counter()
                kill(engine)
                until(http, readyz, 503)
                down_s = time.perf_counter() - killed
                engine = start(cycle)
                up_s = until(http, readyz, 200)
                downs.append(down_s)
                ups.append(up_s)
                print(
                    f"cycle {cycle}: engine killed -> /readyz 503 in {down_s:.2f} s; "
                    f"engine healthy again -> /readyz 200 in {up_s:.2f} s"
                )
            print(f"largest: 503 in {max(downs):.2f} s, 200 in {max(ups):.2f} s")
    finally:
        kill(engine)


if __name__ == "__main__":
    main()
