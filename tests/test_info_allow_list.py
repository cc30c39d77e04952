"""The info paths through the proxy in front of prism-sim (issue 34: an engine's admin
key, address and paths came back through `/get_server_info`): no secret, address or path
of the engine in any answer, found by the rule of `tests/info_leaks.py` over the
engine's own answers; what gateways and a proxy in front read is still there; with the
engine down the errors do not name it either. The same against a real SGLang:
`tests/sglang/test_deploy_live.py`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from info_leaks import Secrets
from proxy_support import proxy_config

from loadgen.stack.processes import ServerProcess, run_server
from prism_proxy.admission.core import BackendLimits
from prism_proxy.api import engine_info
from prism_proxy.app import start_proxy

# Every GET path of the proxy that answers from the backend, and SGLang's info paths
# the proxy does not serve (404 from the proxy, nothing forwarded).
INFO_PATHS = (
    "/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models",
    "/v1/loads", "/loads", "/v1/loads?include=all&format=prometheus", "/health_generate",
    "/health", "/metrics", "/v1/models/x", "/get_loads", "/hicache/storage-backend",
    "/api/tags", "/", "/ping", "/get_weights_by_name",
)  # fmt: skip


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["--speed", "50", "--log-level", "warning"]
    with run_server("prism_sim", args, log_dir=tmp_path_factory.mktemp("sim")) as server:
        yield server


def engine_secrets(url: str) -> Secrets:
    secrets = Secrets(strings={url, url.split("://")[1]})
    for path in ("/server_info", "/model_info", "/v1/models", "/v1/loads"):
        secrets.add_answer(httpx.get(url + path, timeout=30).json())
    return secrets


async def test_info_paths_show_nothing_of_the_engine(sim: ServerProcess) -> None:
    secrets = engine_secrets(sim.url)
    # the rule found the engine's address and model path in its own answers
    assert "127.0.0.1" in secrets.strings and sim.url.rsplit(":", 1)[1].isdigit()
    raw = httpx.get(sim.url + "/server_info", timeout=30).json()
    assert raw["model_path"] in secrets.strings and raw["port"] in secrets.ports
    proxy = await start_proxy(proxy_config(sim.url))
    try:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as http:
            for path in INFO_PATHS:
                answer = await http.get(path)
                assert answer.status_code in (200, 404), (path, answer.text)
                assert not secrets.leaks(answer.text), (path, secrets.leaks(answer.text))
            proxied = (await http.get("/server_info")).json()
            model = (await http.get("/v1/models")).json()["data"][0]
    finally:
        await proxy.stop()
    # What a gateway and a proxy in front of this one read is still there, unchanged.
    for key in engine_info.SERVER_INFO:
        if key in raw and key not in ("internal_states", "served_model_name"):
            assert proxied[key] == raw[key], key
    assert BackendLimits.from_server_info(proxied) == BackendLimits.from_server_info(raw)
    assert BackendLimits.from_server_info(proxied).max_running_requests is not None
    assert model["owned_by"] == "sglang"  # smg detects an SGLang worker by it
    assert model["id"] == raw["served_model_name"].rsplit("/", 1)[-1]


async def test_errors_with_the_engine_down_do_not_name_it(tmp_path) -> None:
    with run_server("prism_sim", ["--log-level", "warning"], log_dir=tmp_path) as engine:
        secrets = engine_secrets(engine.url)
        proxy = await start_proxy(proxy_config(engine.url))
        engine.stop()
    try:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as http:
            for path in INFO_PATHS:
                answer = await http.get(path)
                assert answer.status_code in (200, 404, 502, 503), (path, answer.text)
                assert not secrets.leaks(answer.text), (path, secrets.leaks(answer.text))
    finally:
        await proxy.stop()
