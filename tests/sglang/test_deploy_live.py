"""docker-compose.yml's deployment on this CPU, against a real SGLang 0.5.23 (issue 34).

One SGLang server runs the compose file's `sglang` service: its command and
environment as rendered with `deploy/.env.example` (control token filled in), with what
`tests/deploy_settings.py` replaces (addresses, ports, the tiny CPU model for
`/models/...`, SGLang's CPU flags), plus an admin API key and a download directory so
that there are secrets and paths to leak. It stands in for the scale-out replicas
`sglang-2` and `sglang-3` too (one engine on this machine; their control aliases reach
its RPC).

* every profile: every proxy service (and smg gateway) started with exactly the
  settings the file renders, from the proxy image's entrypoint, healthy by the image's
  own healthcheck; a chat through each; each runs with the settings it was given and
  learned SGLang's limits; DART took their pushes;
* every GET path of SGLang and of the proxy, asked through the proxy: no key, host,
  port or path of the engine in any answer (found by `tests/info_leaks.py`'s rule over
  SGLang's own answers); every field the allow-lists keep that SGLang sends passes with
  SGLang's value, and every field they list exists in SGLang's output.
"""

from __future__ import annotations

import re
import secrets
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from deploy_settings import (
    PROFILES,
    REPO,
    Loopback,
    Stack,
    accepted_epoch,
    assert_runs_with_its_settings,
    assert_served,
    chat,
    env_file_values,
    env_file_with_token,
    eventually,
    has_compose,
    render,
    stack_up,
)
from info_leaks import Secrets

from loadgen.experiments.scale_out import SMG
from prism_proxy.admission.core import BackendLimits
from prism_proxy.api import engine_info
from sglang_cpu.model import ensure_tiny_model

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(not has_compose(), reason="docker-compose is not installed; `make tools`"),
]
ENGINES = ("sglang", "sglang-2", "sglang-3")
TOKEN = secrets.token_hex(16)
ENGINE_STARTUP_S = 600.0  # a deadline: under load SGLang took 260 s to start here


def pythons() -> dict[str, str]:
    return {k: sys.executable for k in ("proxy", "sim", "sglang")} | {"smg": str(SMG.python)}


def startup_timeout(service: Any) -> float:
    return ENGINE_STARTUP_S if service.kind == "sglang" else 120.0


class Engine:
    """The compose file's SGLang, running, and how the compose names reach it."""

    def __init__(self, config: dict[str, Any], stack: Stack) -> None:
        self.config = config
        self.stack = stack

    @property
    def loopback(self) -> Loopback:
        return self.stack.loopback

    @property
    def url(self) -> str:
        return self.stack.base_url("sglang")

    @property
    def api_key(self) -> str:
        return self.stack.services["sglang"].env["PRISM_ENGINE_API_KEY"]

    @property
    def admin_api_key(self) -> str:
        return self.stack.services["sglang"].env["PRISM_ENGINE_ADMIN_API_KEY"]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    workdir = tmp_path_factory.mktemp("compose-sglang")
    env_file = env_file_with_token(workdir, TOKEN)
    config = render("docker-compose.yml", env_file)
    model_mount = REPO / env_file_values(env_file)["MODEL_DIR"]
    download_dir = workdir / "downloads"
    download_dir.mkdir()
    stack = Stack(
        config, None, workdir, pythons=pythons(), model_dir=ensure_tiny_model(),
        model_mount=model_mount.resolve(), same={name: "sglang" for name in ENGINES},
        extra_args={"sglang": ["--download-dir", str(download_dir)]},
    )  # fmt: skip
    try:
        stack.start("sglang", ENGINE_STARTUP_S)
        yield Engine(config, stack)
    finally:
        stack.down()


def profile_stack(engine: Engine, profile: str | None, workdir: Path) -> Stack:
    return Stack(engine.config, profile, workdir, pythons=pythons(), loopback=engine.loopback)


@pytest.mark.timeout(600, func_only=True)
@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p or "default")
def test_compose_file_starts_and_serves_a_chat(
    profile: str | None, engine: Engine, tmp_path: Path
) -> None:
    stack = profile_stack(engine, profile, tmp_path)
    if stack.of_kind("smg") and not SMG.runs():
        pytest.skip("smg is not installed: `make smg-peer`")
    with stack_up(stack, startup_timeout, skip=frozenset(ENGINES)):
        controls = set()
        for name in stack.of_kind("proxy"):
            assert_served(chat(stack.base_url(name)))
            assert_runs_with_its_settings(stack, name, engine.url)
            controls |= set(stack.running[name].env["PRISM_CONTROL_URL"].split(","))
        for name in stack.of_kind("smg"):
            # smg in front of the engines holds their key and requires it of its clients
            key = stack.running[name].env.get("SMG_API_KEY")
            assert_served(chat(stack.base_url(name), key))
        # Every control URL of every proxy is the engine's DART RPC, which took pushes.
        (control,) = controls
        assert control == engine.loopback.url("sglang", "30001")
        eventually(lambda: accepted_epoch(control, TOKEN) > 0, timeout_s=60)


def get_paths() -> list[str]:
    """Every GET path of SGLang 0.5.23's HTTP server and of the proxy (path parameters
    filled in)."""
    from aiohttp import web

    with warnings.catch_warnings():  # GPU-only modules warn at import on a CPU
        warnings.simplefilter("ignore")
        from sglang.srt.entrypoints import http_server

    from prism_proxy.config import ProxyConfig
    from prism_proxy.edge.endpoints import add_routes
    from prism_proxy.edge.probes import add_probe_routes

    paths = {r.path for r in http_server.app.routes if "GET" in (getattr(r, "methods", None) or ())}
    app = web.Application()
    add_routes(app, ProxyConfig())
    add_probe_routes(app)
    paths |= {r.resource.canonical for r in app.router.routes() if r.method == "GET"}
    paths |= {"/v1/loads", "/v1/loads?include=all", "/v1/loads?format=prometheus"}
    return sorted(re.sub(r"\{[^}]+\}", "x", path) for path in paths)


@pytest.mark.timeout(300, func_only=True)
def test_no_info_path_shows_the_engines_secrets(engine: Engine, tmp_path: Path) -> None:
    direct: dict[str, Any] = {}
    for path in ("/server_info", "/model_info", "/v1/models", "/v1/loads"):
        answer = httpx.get(engine.url + path, headers=engine.headers, timeout=60)
        assert answer.status_code == 200, (path, answer.text)
        direct[path] = answer.json()
    leaks = Secrets(strings={engine.url, engine.url.split("://")[1], TOKEN, engine.api_key})
    for answer in direct.values():
        leaks.add_answer(answer)
    raw = direct["/server_info"]
    # SGLang's own answer holds them, at the top level and in internal_states: the rule
    # finds the admin key, the address, the paths, the launch command.
    admin_key = engine.admin_api_key
    assert raw["admin_api_key"] == raw["internal_states"][0]["admin_api_key"] == admin_key
    assert raw["api_key"] == engine.api_key  # the compose file's keys reached SGLang
    assert {admin_key, raw["host"], raw["model_path"], raw["download_dir"]} <= leaks.strings
    assert raw["port"] in leaks.ports and raw["launch_command"] in leaks.strings

    stack = profile_stack(engine, None, tmp_path)
    assert set(stack.services) == {"sglang", "proxy"}
    with stack_up(stack, startup_timeout, skip=frozenset(ENGINES)):
        proxied: dict[str, Any] = {}
        with httpx.Client(base_url=stack.base_url("proxy"), timeout=60) as http:
            for path in get_paths():
                answer = http.get(path)
                assert answer.status_code < 500, (path, answer.status_code, answer.text)
                assert not leaks.leaks(answer.text), (path, leaks.leaks(answer.text))
                if answer.status_code == 200 and path in direct:
                    proxied[path] = answer.json()
    assert set(proxied) == set(direct)

    # The allow-lists are SGLang's own field names, and keep SGLang's values.
    smg_only = {"model_id", "model"}  # sgl-model-gateway's names for other engines
    sim_only = {"num_running_reqs", "num_queue_reqs"}  # prism-sim's scheduler state
    assert set(engine_info.SERVER_INFO) - smg_only <= set(raw)
    state_spec = engine_info.SERVER_INFO["internal_states"]
    assert state_spec(raw["internal_states"])[0]  # SGLang's state entry passes
    server = proxied["/server_info"]
    for key in set(engine_info.SERVER_INFO) & set(raw) - {"served_model_name", "internal_states"}:
        assert server[key] == raw[key], key
    for key in server["internal_states"][0]:
        assert server["internal_states"][0][key] == raw["internal_states"][0][key]
    assert set(server["internal_states"][0]) | sim_only >= {
        "effective_max_running_requests_per_dp", "last_gen_throughput"
    }  # fmt: skip
    assert server["served_model_name"] == Path(raw["served_model_name"]).name
    assert BackendLimits.from_server_info(server) == BackendLimits.from_server_info(raw)

    model_info = direct["/model_info"]
    assert set(engine_info.MODEL_INFO) <= set(model_info)
    for key in set(engine_info.MODEL_INFO) - {"served_model_name"}:
        assert proxied["/model_info"].get(key) == model_info[key], key
    card, raw_card = proxied["/v1/models"]["data"][0], direct["/v1/models"]["data"][0]
    assert card["owned_by"] == raw_card["owned_by"] == "sglang"  # smg's backend detection
    assert card["id"] == Path(raw_card["id"]).name
    assert card["max_model_len"] == raw_card["max_model_len"]
    rank, raw_rank = proxied["/v1/loads"]["loads"][0], direct["/v1/loads"]["loads"][0]
    assert set(rank) == set(raw_rank)  # every load figure SGLang sends passes
