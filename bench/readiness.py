"""How fast the proxy's /readyz follows the engine: dying, and coming back.

    python -m bench.readiness [--cycles 5]

Starts prism-sim and `prism-proxy serve` (real subprocesses, default settings: the
readiness probe every `ready_interval_s` = 1 s). Each cycle: /readyz is 200; the engine
is killed (SIGKILL); the time until /readyz answers 503 is measured; a new engine
process starts on the same port; once it answers its own /health, the time until
/readyz answers 200 is measured. /readyz is polled every 20 ms. Prints each cycle and
the largest of each; no thresholds (issue 36's target: both within 2 s).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from loadgen.processes import free_port, run_server, spawn_server, wait_healthy

SIM_ARGS = ["--speed", "50", "--log-level", "warning"]
POLL_S = 0.02


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
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="prism-readiness-"))
    port = free_port()
    engine = spawn_server("prism_sim", SIM_ARGS, port=port, log_dir=logs, name="sim-0")
    try:
        wait_healthy(engine.url, engine.process, 60.0, "/health")
        proxy_args = ["serve", "--backend", engine.url, "--log-level", "warning"]
        with run_server("prism_proxy", proxy_args, log_dir=logs) as proxy, httpx.Client() as http:
            readyz = proxy.url + "/readyz"
            downs, ups = [], []
            for cycle in range(1, args.cycles + 1):
                until(http, readyz, 200)
                engine.process.kill()
                down_s = until(http, readyz, 503)
                engine.process.wait()
                engine = spawn_server(
                    "prism_sim", SIM_ARGS, port=port, log_dir=logs, name=f"sim-{cycle}"
                )
                wait_healthy(engine.url, engine.process, 60.0, "/health")
                up_s = until(http, readyz, 200)
                downs.append(down_s)
                ups.append(up_s)
                print(
                    f"cycle {cycle}: engine killed -> /readyz 503 in {down_s:.2f} s; "
                    f"engine healthy again -> /readyz 200 in {up_s:.2f} s"
                )
            print(f"largest: 503 in {max(downs):.2f} s, 200 in {max(ups):.2f} s")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
