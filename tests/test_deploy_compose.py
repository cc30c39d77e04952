"""The compose files validate with `docker-compose config` and wire the stack as
docs/deploy.md says; the Dockerfiles ship every package of the project."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILES = {"gpu": "docker-compose.yml", "sim": "docker-compose.sim.yml"}
ENGINE = {"gpu": "sglang", "sim": "prism-sim"}
TOKEN = "test-token-0123456789abcdef"
ENGINE_KEY = "engine-key-0123456789abcdef"
ADMIN_KEY = "admin-key-0123456789abcdef"
GRAFANA_PASSWORD = "grafana-0123456789abcdef"
# The secrets each compose file requires (it refuses to start without one).
SECRETS = {
    "PRISM_CONTROL_TOKEN": TOKEN,
    "PRISM_ENGINE_API_KEY": ENGINE_KEY,
    "PRISM_ENGINE_ADMIN_API_KEY": ADMIN_KEY,
    "GRAFANA_ADMIN_PASSWORD": GRAFANA_PASSWORD,
}
REQUIRED = {
    "gpu": sorted(SECRETS),
    "sim": sorted(set(SECRETS) - {"PRISM_ENGINE_ADMIN_API_KEY"}),  # prism-sim has no admin API
}

needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose (Debian package docker-compose, v1) is not installed; `make tools`",
)


def compose_config(
    compose_file: str, tmp_path: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` with only `env` on top of a clean environment (no .env)."""
    empty_env_file = tmp_path / "empty.env"
    empty_env_file.write_text("")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PRISM_", "COMPOSE_"))}
    return subprocess.run(
        ["docker-compose", "--env-file", str(empty_env_file), "-f", compose_file, "config"],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def resolved(kind: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    result = compose_config(COMPOSE_FILES[kind], tmp_path, {**SECRETS, **env})
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def command_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


@needs_compose
@pytest.mark.parametrize("kind", sorted(COMPOSE_FILES))
def test_compose_file_validates_and_wires_the_stack(kind: str, tmp_path: Path) -> None:
    config = resolved(kind, tmp_path)
    services = config["services"]
    engine = ENGINE[kind]
    default = {name for name, service in services.items() if not service.get("profiles")}
    assert default == {engine, "proxy", "prometheus", "grafana"}

    # The proxy waits for a healthy engine, and the engine's healthcheck probes /health.
    assert services["proxy"]["depends_on"] == {engine: {"condition": "service_healthy"}}
    assert "/health" in " ".join(services[engine]["healthcheck"]["test"])

    # One control token, shared by the engine, the proxy and Prometheus's DART scrape.
    for name in (engine, "proxy", "prometheus"):
        assert services[name]["environment"]["PRISM_CONTROL_TOKEN"] == TOKEN
    # The proxy pushes to the engine's control port on the internal network.
    control_url = services["proxy"]["environment"]["PRISM_CONTROL_URL"]
    host, port = re.fullmatch(r"http://([\w.-]+):(\d+)", control_url).groups()
    engine_env = services[engine]["environment"]
    control_port = engine_env.get("PRISM_CONTROL_PORT") or command_value(
        services[engine]["command"], "--control-port"
    )
    assert port == control_port
    engine_names = {engine}
    for network in services[engine]["networks"].values():
        engine_names |= set((network or {}).get("aliases") or [])
    assert host in engine_names

    # The engine publishes no port and is on the internal network only, which has no
    # route out; Prometheus and Grafana meet on `monitoring`, which has none either.
    assert "ports" not in services[engine]
    assert config["networks"]["internal"]["internal"] is True
    assert config["networks"]["monitoring"]["internal"] is True
    assert set(services[engine]["networks"]) == {"internal"}
    assert "internal" in services["proxy"]["networks"]
    assert "internal" not in services["grafana"]["networks"]
    assert set(services["prometheus"]["networks"]) == {"internal", "monitoring"}
    # Only the proxy and Grafana publish a port.
    assert {name for name in default if services[name].get("ports")} == {"proxy", "grafana"}

    # The engine requires its API key, which the proxy holds (SGLang also its admin key).
    assert services[engine]["environment"]["PRISM_ENGINE_API_KEY"] == ENGINE_KEY
    assert services["proxy"]["environment"]["PRISM_ENGINE_API_KEY"] == ENGINE_KEY
    if kind == "gpu":
        assert services[engine]["environment"]["PRISM_ENGINE_ADMIN_API_KEY"] == ADMIN_KEY
    # Grafana's admin password is the one given; Prometheus has no lifecycle API.
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == GRAFANA_PASSWORD
    prometheus_argv = " ".join(services["prometheus"]["entrypoint"])
    assert "--web.enable-lifecycle" not in prometheus_argv
    # The proxy's /metrics is on its admin listener, which Prometheus scrapes, not on
    # the client port.
    listen = services["proxy"]["environment"]["PRISM_METRICS_LISTEN"]
    metrics_port = listen.rpartition(":")[2]
    assert metrics_port != "8000"
    scrape = yaml.safe_load(
        (
            REPO
            / "deploy"
            / "prometheus"
            / ("prometheus.yml" if kind == "gpu" else "prometheus.sim.yml")
        ).read_text()
    )
    jobs = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in scrape["scrape_configs"]
    }
    assert jobs["prism-proxy"] == [f"proxy:{metrics_port}"]

    # Grafana gets the provisioning and the dashboard; Prometheus its config.
    grafana_mounts = " ".join(services["grafana"]["volumes"])
    assert "/etc/grafana/provisioning" in grafana_mounts
    assert any(p.split("/")[0].endswith(":3000") for p in services["grafana"]["ports"])
    prometheus_mounts = services["prometheus"]["volumes"]
    config_mount = next(v for v in prometheus_mounts if "/etc/prometheus/prometheus.yml" in v)
    assert (REPO / "deploy" / "prometheus").as_posix() in config_mount
    # Our own images run read-only, without capabilities.
    for name in {"proxy", engine} - {"sglang"}:
        assert services[name]["read_only"] is True
        assert services[name]["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in services[name]["security_opt"]
    # Published ports bind to loopback unless told otherwise.
    for name in ("proxy", "grafana"):
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"])


@needs_compose
def test_gpu_stack_reserves_a_gpu_and_enables_the_plugin(tmp_path: Path) -> None:
    services = resolved("gpu", tmp_path, MODEL_PATH="/models/m", SGLANG_GPU_COUNT="2")["services"]
    sglang = services["sglang"]
    devices = sglang["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"
    assert int(devices[0]["count"]) == 2
    assert "gpu" in devices[0]["capabilities"]
    assert sglang["shm_size"]
    command = sglang["command"]
    assert command_value(command, "--radix-cache-backend") == "prism_dart"
    assert command_value(command, "--model-path") == "/models/m"
    assert "--enable-metrics" in command
    assert "--enable-cache-report" in command
    assert "--incremental-streaming-output" in command
    assert sglang["build"]["dockerfile"] == "deploy/sglang.Dockerfile"
    # The proxy sees the model directory at the same path (for --tokenizer auto).
    assert services["proxy"]["environment"]["PRISM_TOKENIZER"] == "auto"
    model_mount = next(v for v in services["proxy"]["volumes"] if ":/models" in v)
    assert model_mount in sglang["volumes"]


@needs_compose
def test_sim_stack_runs_dart_with_the_control_rpc(tmp_path: Path) -> None:
    services = resolved("sim", tmp_path)["services"]
    command = services["prism-sim"]["command"]
    assert command_value(command, "--eviction") == "dart"
    assert command_value(command, "--control-port")
    assert services["proxy"]["environment"]["PRISM_BACKEND"] == "http://prism-sim:30000"
    assert "deploy" not in services["prism-sim"]  # no GPU reservation


@needs_compose
@pytest.mark.parametrize(
    ("kind", "secret"), [(kind, secret) for kind in sorted(REQUIRED) for secret in REQUIRED[kind]]
)
def test_compose_refuses_to_start_without_a_secret(kind: str, secret: str, tmp_path: Path) -> None:
    """Each secret is required: unset or empty, the file does not render (no default
    password, no open engine)."""
    for value in (None, ""):
        env = {name: v for name, v in SECRETS.items() if name != secret}
        if value is not None:
            env[secret] = value
        result = compose_config(COMPOSE_FILES[kind], tmp_path, env)
        assert result.returncode != 0
        assert secret in result.stderr


def _dockerfile(name: str) -> str:
    return (REPO / "deploy" / name).read_text()


def _packages() -> set[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return {p.rstrip("*") for p in patterns}


@pytest.mark.parametrize("name", ["proxy.Dockerfile", "sim.Dockerfile", "sglang.Dockerfile"])
def test_dockerfiles_copy_every_package(name: str) -> None:
    copied = set(re.findall(r"^COPY (\w+) ", _dockerfile(name), flags=re.MULTILINE))
    assert _packages() <= copied
    for package in _packages():
        assert (REPO / package / "__init__.py").exists()


def test_proxy_image_is_slim_non_root_with_a_healthcheck() -> None:
    text = _dockerfile("proxy.Dockerfile")
    assert re.search(r"^FROM python:3\.11-slim\b", text, flags=re.MULTILINE)
    assert re.search(r"^RUN pip install \.", text, flags=re.MULTILINE)
    user = re.findall(r"^USER (\S+)", text, flags=re.MULTILINE)
    assert user and user[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*/readyz", text, flags=re.MULTILINE)
    assert 'ENTRYPOINT ["prism-proxy", "serve"]' in text


def test_sglang_image_adds_the_plugin_to_the_pinned_official_image() -> None:
    text = _dockerfile("sglang.Dockerfile")
    base = re.search(r"^ARG SGLANG_IMAGE=(\S+)", text, flags=re.MULTILINE).group(1)
    assert base.startswith("lmsysorg/sglang:v0.5.23")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "sglang==0.5.23" in pyproject["project"]["optional-dependencies"]["sglang"]
    assert "pip install --no-deps ." in text
    entry_points = pyproject["project"]["entry-points"]["sglang.srt.plugins"]
    assert "prism_dart" in entry_points
    assert "'prism_dart' in names" in text  # the build fails without the entry point
    assert "--radix-cache-backend" in text


def _image_env(dockerfile: str) -> dict[str, str]:
    """`ENV NAME=value` pairs of a Dockerfile (continuation lines joined)."""
    text = _dockerfile(dockerfile).replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.+)$", text, flags=re.MULTILINE):
        env.update(pair.split("=", 1) for pair in line.split())
    return env


@needs_compose
@pytest.mark.parametrize("kind", sorted(COMPOSE_FILES))
def test_the_real_clis_accept_the_compose_settings(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy's environment (image + compose) and the engine's command line parse with
    the project's own configuration code into the intended settings."""
    from prism_proxy.config_sources import build_config

    services = resolved(kind, tmp_path)["services"]
    proxy_env = {**_image_env("proxy.Dockerfile"), **services["proxy"]["environment"]}
    config = build_config({}, {k: str(v) for k, v in proxy_env.items()})
    engine = ENGINE[kind]
    assert config.host == "0.0.0.0"
    assert config.port == 8000
    assert config.backend == f"http://{engine}:30000"
    assert config.control_token == TOKEN
    assert config.engine_api_key == ENGINE_KEY
    assert config.metrics_listen == services["proxy"]["environment"]["PRISM_METRICS_LISTEN"]
    assert config.control_url == services["proxy"]["environment"]["PRISM_CONTROL_URL"]
    assert config.policy == "prism"
    assert config.tokenizer == ("auto" if kind == "gpu" else "builtin")
    if kind == "gpu":
        from backend_plugin.config import load_config

        plugin = load_config({k: str(v) for k, v in services[engine]["environment"].items()})
        plugin.control.check_auth()  # a token is configured: the RPC will start
        assert plugin.policy.value == "dart"
        assert plugin.control.token == TOKEN
        assert plugin.control.host == "sglang-control"
        assert config.control_url == f"http://{plugin.control.host}:{plugin.control.port}"
        # The image's launcher gives SGLang both keys from the service's environment.
        from backend_plugin.launch import build_argv

        engine_env = {k: str(v) for k, v in services[engine]["environment"].items()}
        argv = build_argv([str(a) for a in services[engine]["command"]], engine_env)
        assert command_value(argv, "--api-key") == ENGINE_KEY
        assert command_value(argv, "--admin-api-key") == ADMIN_KEY
    if kind == "sim":
        from prism_sim.cli import build_parser, config_from_args

        engine_env = {k: str(v) for k, v in services[engine]["environment"].items()}
        monkeypatch.setattr(os, "environ", engine_env)
        sim = config_from_args(build_parser().parse_args(services[engine]["command"]))
        assert sim.api_key == ENGINE_KEY
        assert sim.eviction == "dart"
        assert sim.control_port == 30001
        assert sim.host == "0.0.0.0"
        assert sim.port == 30000


def test_every_compose_variable_is_in_env_example_and_documented() -> None:
    used = set()
    for compose_file in COMPOSE_FILES.values():
        used |= set(re.findall(r"(?<!\$)\$\{(\w+)", (REPO / compose_file).read_text()))
    assert "PRISM_CONTROL_TOKEN" in used
    example = set(re.findall(r"^(\w+)=", (REPO / "deploy" / ".env.example").read_text(), re.M))
    assert not used - example, f"missing from deploy/.env.example: {sorted(used - example)}"
    assert not example - used, f"unused in the compose files: {sorted(example - used)}"
    doc = (REPO / "docs" / "deploy.md").read_text()
    undocumented = sorted(v for v in used if f"`{v}`" not in doc)
    assert not undocumented, f"docs/deploy.md does not describe {undocumented}"


def scale_out_services(kind: str, profile: str, tmp_path: Path) -> dict[str, Any]:
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PRISM_", "COMPOSE_"))}
    result = subprocess.run(
        ["docker-compose", "--env-file", str(env_file), "-f", COMPOSE_FILES[kind],
         "--profile", profile, "config"],
        cwd=REPO, env={**clean, **SECRETS}, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def _workers(command: list[str]) -> list[str]:
    return command[command.index("--worker-urls") + 1 : command.index("--policy")]


@needs_compose
@pytest.mark.parametrize("kind", sorted(COMPOSE_FILES))
def test_scale_out_profile_puts_one_prism_in_front_of_smg(kind: str, tmp_path: Path) -> None:
    """`--profile scale-out` (topology B, docs/scale-out.md): the front proxy sends to smg
    (cache_aware) over three engines and pushes to every engine's DART RPC."""
    services = scale_out_services(kind, "scale-out", tmp_path)
    engine = ENGINE[kind]
    gateway = services["gateway"]["command"]
    assert _workers(gateway) == [f"http://{engine}{s}:30000" for s in ("", "-2", "-3")]
    assert command_value(gateway, "--policy") == "cache_aware"
    assert not services["gateway"].get("ports")
    # smg holds the engines' key (it sends it to them), from its environment
    assert services["gateway"]["environment"]["SMG_API_KEY"] == ENGINE_KEY
    assert "--api-key" not in gateway
    front = services["proxy-front"]["environment"]
    assert front["PRISM_BACKEND"] == "http://gateway:8080"
    controls = front["PRISM_CONTROL_URL"].split(",")
    assert len(controls) == 3 and all(url.endswith(":30001") for url in controls)
    assert services["proxy-front"]["ports"]
    for n in (2, 3):
        assert not services[f"{engine}-{n}"].get("ports")


@needs_compose
@pytest.mark.parametrize("kind", sorted(COMPOSE_FILES))
def test_sidecar_profile_puts_smg_in_front_of_three_proxies(kind: str, tmp_path: Path) -> None:
    """`--profile scale-out-sidecars` (topology A): smg routes over three proxies, each in
    front of its own engine and that engine's control RPC; the Prometheus config for the
    scale-out profiles scrapes every replica and both gateways."""
    services = scale_out_services(kind, "scale-out-sidecars", tmp_path)
    engine = ENGINE[kind]
    gateway = services["gateway-sidecars"]["command"]
    assert _workers(gateway) == ["http://proxy:8000", "http://proxy-2:8000", "http://proxy-3:8000"]
    assert command_value(gateway, "--policy") == "consistent_hashing"
    for n in (2, 3):
        proxy = services[f"proxy-{n}"]
        assert proxy["environment"]["PRISM_BACKEND"] == f"http://{engine}-{n}:30000"
        control = proxy["environment"]["PRISM_CONTROL_URL"]
        assert control.startswith(f"http://{engine}-{n}") and control.endswith(":30001")
        assert not proxy.get("ports") and f"{engine}-{n}" in proxy["depends_on"]
        assert not services[f"{engine}-{n}"].get("ports")
    assert services["gateway-sidecars"]["ports"]
    suffix = "" if kind == "gpu" else ".sim"
    scrape = yaml.safe_load(
        (REPO / "deploy" / "prometheus" / f"prometheus.scale-out{suffix}.yml").read_text()
    )
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in scrape["scrape_configs"]
    }
    assert {"proxy:9100", "proxy-front:9100", "proxy-2:9100", "proxy-3:9100"} == set(
        targets["prism-proxy"]
    )
    assert len(targets["sglang"]) == len(targets["prism-dart"]) == 3
    assert targets["smg"] == ["gateway:29000", "gateway-sidecars:29000"]
