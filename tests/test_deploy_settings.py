"""The deployment starts with what `deploy/` ships and serves a chat (issue 34: a
`.env.example` the proxy refused made docker compose crash-loop, and no test started
the proxy with the shipped settings).

* docker-compose.sim.yml with `deploy/.env.example` (its control token filled in), in
  each profile: every proxy and prism-sim service started with the settings the file
  renders, from its image's entrypoint (`tests/deploy_settings.py` says what is replaced:
  addresses, ports, paths inside images, programs), healthy by its own healthcheck; a
  chat through every proxy and every smg gateway; each proxy runs with the settings
  the file gave it, by its own account (`/server_info`);
* the Dockerfiles' own `docker run` examples: started the same way, a chat through
  the proxy, and every published port bound to all of the container's addresses;
* every value `.env.example` gives a proxy or prism-sim setting parses;
* `.env`, where the control token goes, is ignored by git.

docker-compose.yml (real SGLang) is started the same way in `tests/sglang/
test_deploy_live.py`.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deploy_settings import (
    ENV_EXAMPLE,
    PROFILES,
    REPO,
    Service,
    Stack,
    accepted_epoch,
    assert_runs_with_its_settings,
    assert_served,
    chat,
    dockerfile_examples,
    env_file_values,
    env_file_with_token,
    eventually,
    has_compose,
    render,
    stack_up,
)

from loadgen.experiments.scale_out import SMG
from prism_proxy.config_sources import build_config
from prism_sim.cli import build_parser, config_from_args

needs_compose = pytest.mark.skipif(
    not has_compose(),
    reason="docker-compose (Debian package docker-compose, v1) is not installed; `make tools`",
)
TOKEN = secrets.token_hex(16)


def pythons() -> dict[str, str]:
    return {"proxy": sys.executable, "sim": sys.executable, "smg": str(SMG.python)}


def startup_timeout(service: Service) -> float:
    return 120.0


@pytest.fixture(scope="module")
def sim_config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env_file = env_file_with_token(tmp_path_factory.mktemp("env"), TOKEN)
    return render("docker-compose.sim.yml", env_file)


@needs_compose
@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p or "default")
def test_sim_compose_file_starts_and_serves_a_chat(
    profile: str | None, sim_config: dict[str, Any], tmp_path: Path
) -> None:
    stack = Stack(sim_config, profile, tmp_path, pythons=pythons())
    if stack.of_kind("smg") and not SMG.runs():
        pytest.skip("smg is not installed: `make smg-peer`")
    assert stack.of_kind("proxy") and stack.of_kind("sim")
    with stack_up(stack, startup_timeout):
        engine_url = stack.base_url(stack.of_kind("sim")[0])
        for name in stack.of_kind("proxy"):
            assert_served(chat(stack.base_url(name)))
            assert_runs_with_its_settings(stack, name, engine_url)
        for name in stack.of_kind("smg"):
            # smg in front of the engines holds their key and requires it of its clients
            key = stack.running[name].env.get("SMG_API_KEY")
            assert_served(chat(stack.base_url(name), key))
        # The proxies reach each engine's control RPC with the shipped token: every
        # engine a proxy pushes to has taken a priority table.
        controls = {
            url
            for name in stack.of_kind("proxy")
            for url in stack.running[name].env["PRISM_CONTROL_URL"].split(",")
        }
        assert len(controls) == len(stack.of_kind("sim"))
        for control in controls:
            eventually(lambda url=control: accepted_epoch(url, TOKEN) > 0, timeout_s=60)


def published_bind_hosts(service: Service) -> list[str]:
    """The address each published port of a proxy or prism-sim service binds, as the
    program's own configuration code reads its settings."""
    if not service.published:
        return []
    if service.kind == "proxy":
        config = build_config({}, service.env)
        return [config.host for port in service.published if port == str(config.port)]
    if service.kind == "sim":
        config = config_from_args(build_parser().parse_args(service.argv[1:]))
        return [config.host for port in service.published if port == str(config.port)]
    raise AssertionError(f"no reader for {service.kind}")


def test_dockerfile_examples_start_and_serve_a_chat(tmp_path: Path) -> None:
    """Each Dockerfile's header `docker run` line; the proxy's names its backend
    `sglang`, which prism-sim stands in for here (the network alias `sglang`)."""
    config = dockerfile_examples({"PRISM_CONTROL_TOKEN": TOKEN})
    assert {"prism-proxy", "prism-sim"} <= set(config["services"])
    config["services"]["prism-sim"]["networks"] = {"default": {"aliases": ["sglang"]}}
    config["services"]["prism-proxy"]["depends_on"] = ["prism-sim"]
    stack = Stack(config, None, tmp_path, pythons=pythons())
    for service in stack.services.values():
        # published ports must be reachable from outside the container
        hosts = published_bind_hosts(service)
        assert hosts and all(host == "0.0.0.0" for host in hosts), (service.name, hosts)
    with stack_up(stack, startup_timeout):
        assert_served(chat(stack.base_url("prism-proxy")))


def test_every_env_example_value_parses() -> None:
    """The proxy's and prism-sim's settings in `.env.example` (PRISM_* the proxy reads;
    SIM_*, PRISM_DART_POLICY as prism-sim's command line uses them) parse; the proxy
    refuses the `0` the file once gave (the test can fail)."""
    values = env_file_values(ENV_EXAMPLE)
    proxy_env = {k: v for k, v in values.items() if k.startswith("PRISM_")}
    proxy_env |= {"PRISM_CONTROL_TOKEN": TOKEN, "PRISM_ENGINE_API_KEY": "k3y"}
    config = build_config({}, proxy_env)
    assert config.prefill_batch is None and config.max_inflight is None  # auto
    assert config.policy == values["PRISM_POLICY"]
    with pytest.raises(ValueError, match="must be 'auto' or >= 1"):
        build_config({}, {**proxy_env, "PRISM_PREFILL_BATCH": "0"})
    sim = config_from_args(
        build_parser().parse_args(
            ["--profile", values["SIM_PROFILE"], "--speed", values["SIM_SPEED"],
             "--eviction", values["PRISM_DART_POLICY"]]
        )
    )  # fmt: skip
    assert sim.eviction == values["PRISM_DART_POLICY"] and sim.speed == float(values["SIM_SPEED"])


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)
def test_env_is_ignored_by_git() -> None:
    for path in (".env", "deploy/.env"):
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", path], cwd=REPO, check=False, timeout=30
        )
        assert ignored.returncode == 0, f"{path} is not in .gitignore"
    example = subprocess.run(
        ["git", "check-ignore", "-q", "deploy/.env.example"], cwd=REPO, check=False, timeout=30
    )
    assert example.returncode == 1  # the example itself stays tracked
