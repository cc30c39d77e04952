"""The Prometheus configurations pass `promtool check config` and scrape what the compose
files run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import REPO, load_script

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
CONFIGS = {
    "prometheus.yml": "docker-compose.yml",
    "prometheus.sim.yml": "docker-compose.sim.yml",
    "prometheus.scale-out.yml": "docker-compose.yml",
    "prometheus.scale-out.sim.yml": "docker-compose.sim.yml",
}

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool (Debian package prometheus) is not installed; `make tools`",
)


def promtool_check(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", "check", "config", *extra, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def with_token_file(config: dict[str, Any], token_file: Path) -> dict[str, Any]:
    """The same configuration with its credentials files pointing at `token_file` (promtool
    checks that they exist; in compose they live in the Prometheus container's tmpfs)."""
    for job in config["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token_file)
    return config


@needs_promtool
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_promtool_accepts_the_config(name: str, tmp_path: Path) -> None:
    syntax = promtool_check(PROMETHEUS_DIR / name, "--syntax-only")
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr

    token_file = tmp_path / "control-token"
    token_file.write_text("secret")
    config = with_token_file(yaml.safe_load((PROMETHEUS_DIR / name).read_text()), token_file)
    full_path = tmp_path / name
    full_path.write_text(yaml.safe_dump(config))
    full = promtool_check(full_path)
    assert full.returncode == 0, full.stdout + full.stderr


@needs_promtool
def test_promtool_rejects_a_broken_config(tmp_path: Path) -> None:
    """The check above can fail: a scrape job without a name is refused."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.sim.yml").read_text())
    del config["scrape_configs"][0]["job_name"]
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(config))
    assert promtool_check(path, "--syntax-only").returncode != 0


@needs_promtool
def test_promtool_accepts_the_generated_cpu_stack_config(tmp_path: Path) -> None:
    cpu_stack = load_script(REPO / "scripts" / "cpu_stack.py")
    token_file = tmp_path / "control-token"
    token_file.write_text("secret")
    endpoints = cpu_stack.Endpoints("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cpu_stack.prometheus_config(endpoints, token_file)))
    result = promtool_check(path)
    assert result.returncode == 0, result.stdout + result.stderr


def _compose_services(compose_file: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / compose_file).read_text())["services"]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_scrape_targets_are_the_compose_services(name: str) -> None:
    """Every target host is a compose service (or a network alias of one) that Prometheus
    shares a network with; jobs and credentials match what the services serve."""
    config = yaml.safe_load((PROMETHEUS_DIR / name).read_text())
    services = _compose_services(CONFIGS[name])
    prometheus_networks = set(services["prometheus"]["networks"])
    reachable: dict[str, str] = {}
    for service_name, service in services.items():
        networks = service.get("networks") or []
        items = networks.items() if isinstance(networks, dict) else ((n, {}) for n in networks)
        for network, options in items:
            if network in prometheus_networks:
                reachable[service_name] = service_name
                for alias in (options or {}).get("aliases") or []:
                    reachable[alias] = service_name

    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    expected = {"prism-proxy", "sglang", "prism-dart"}
    assert set(jobs) == (expected | {"smg"} if "scale-out" in name else expected)
    for job in jobs.values():
        for target in job["static_configs"][0]["targets"]:
            host, _, port = target.partition(":")
            assert host in reachable, f"{target}: no service {host} on Prometheus's networks"
            assert port.isdigit()
    assert jobs["prism-dart"]["metrics_path"] == "/prism/metrics"
    assert jobs["prism-dart"]["authorization"]["type"] == "Bearer"
    assert jobs["prism-dart"]["authorization"]["credentials_file"] == "/run/prism/control-token"
    # The token file is written inside a tmpfs mounted where the config expects it.
    tmpfs = " ".join(services["prometheus"]["tmpfs"])
    assert "/run/prism" in tmpfs
    assert "/run/prism/control-token" in " ".join(services["prometheus"]["entrypoint"])
