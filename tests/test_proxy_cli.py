"""`prism-proxy serve` as a real subprocess (`python -m prism_proxy serve`): settings
from PRISM_* variables and a config file, and a graceful shutdown that lets an
in-flight stream finish."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest
from proxy_support import sim_server

from loadgen.stack.processes import run_server

sim = pytest.fixture(scope="module")(sim_server)


def test_serve_reads_env_and_config_file(sim, tmp_path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text('policy = "klpm"\nmax_inflight = 3\n[qas]\nk = 3\n')
    env = {"PRISM_CONFIG": str(config), "PRISM_POLICY": "fifo", "PRISM_HEALTH_INTERVAL_S": "0"}
    args = ["serve", "--backend", sim.url]
    with run_server("prism_proxy", args, env=env, log_dir=tmp_path) as proxy:
        health = httpx.get(proxy.url + "/health").json()
        assert health["policy"] == "fifo"  # env beats the file
        response = httpx.post(
            proxy.url + "/v1/completions",
            json={"model": "m", "prompt": "hi", "max_tokens": 2},
            timeout=30,
        )
        assert response.status_code == 200 and response.json()["choices"][0]["text"]
        metrics = httpx.get(proxy.url + "/metrics").text
        assert (
            'prism:requests_total{endpoint="completions",lane="cold",status="200"} 1.0' in metrics
        )


@pytest.mark.parametrize(
    ("flags", "setting"),
    [(["--policy", "nope"], "policy"), (["--metrics-listen", "nope"], "metrics_listen")],
)
def test_bad_setting_exits_with_message(flags: list[str], setting: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "prism_proxy", "serve", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and setting in result.stderr


def _wait_refused(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/health", timeout=1.0)
        except httpx.ConnectError:
            return
        time.sleep(0.01)
    raise AssertionError("the proxy kept accepting connections after SIGTERM")


def test_sigterm_drains_an_in_flight_stream(sim, tmp_path) -> None:
    # The drain's bound is not under test: the stream takes seconds here, over 30 s (the
    # default bound) on a busy machine.
    args = ["serve", "--backend", sim.url, "--set", "health_interval_s=0",
            "--set", "shutdown_timeout_s=600"]  # fmt: skip
    with run_server("prism_proxy", args, log_dir=tmp_path) as proxy:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "long answer please"}],
            "max_tokens": 4000,
            "stream": True,
        }
        events: list[str] = []
        with httpx.stream(
            "POST", proxy.url + "/v1/chat/completions", json=body, timeout=60
        ) as response:
            lines = response.iter_lines()
            events.append(next(lines))
            # Stop the proxy while the answer is still streaming; wait until it no
            # longer accepts connections, then read the rest of the answer.
            proxy.process.send_signal(signal.SIGTERM)
            _wait_refused(proxy.url)
            before = len(events)
            events.extend(lines)
            assert len(events) > before  # the stream went on after listening stopped
        data = [e[6:] for e in events if e.startswith("data: ")]
        assert data[-1] == "[DONE]"
        finish = [json.loads(d)["choices"][0]["finish_reason"] for d in data[:-1]]
        assert finish[-1] == "length"  # the whole answer arrived
        assert proxy.process.wait(timeout=120) == 0


def test_a_tokenizer_unlike_the_engines_stops_the_start(sim, tmp_path) -> None:
    """The default sim serves the builtin tokenizer; a model directory with another
    vocabulary is refused at start: exit code 1, the message names it."""
    import subprocess
    import sys

    from tokenizer_dirs import write_bpe_dir

    other = str(write_bpe_dir(tmp_path / "bpe"))
    result = subprocess.run(
        [sys.executable, "-m", "prism_proxy", "serve", "--backend", sim.url,
         "--tokenizer", other, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert f"error: --tokenizer {other}: tokenizer {other!r} does not match" in result.stderr
    assert "text probe" in result.stderr


def test_tokenizer_auto_uses_the_backends_model_directory(tmp_path) -> None:
    from prism_tokens.builtin import ensure_builtin
    from prism_tokens.tokenizer import default_cache_dir

    model_dir = str(ensure_builtin(default_cache_dir()))
    with (
        run_server("prism_sim", ["--tokenizer", model_dir], log_dir=tmp_path) as backend,
        run_server(
            "prism_proxy", ["serve", "--backend", backend.url, "--tokenizer", "auto"],
            log_dir=tmp_path,
        ) as proxy,
    ):  # fmt: skip
        response = httpx.post(
            proxy.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=30,
        )
        assert response.status_code == 200
        assert f"tokenizer {model_dir}" in proxy.log_text()
