"""The engine's own API key (SGLang's `--api-key`): read from the environment or a file,
never from the command line, and sent on every request to the engine; a client's own
`Authorization` never reaches the engine.

The engine is prism-sim in-process with SGLang's key check (`prism_sim.server`:
`Authorization: Bearer <key>` on every path but health, readiness and metrics, else 401),
the client the real `openai` package. tests/sglang/test_live_engine_key.py runs the same
requests against a real SGLang started with `--api-key`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from proxy_support import loopback_app, running_proxy

from prism_proxy.config import ConfigError
from prism_proxy.config_sources import build_config, parse_serve_args
from prism_proxy.edge.gateway import GATEWAY
from prism_sim.engine import SimConfig
from prism_sim.server import create_app

KEY = "engine-k3y"
CLIENT_KEY = "a-client-key-the-engine-must-never-see"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    },
}


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    """prism-sim requiring `KEY`, in this test's loop, on a loopback port."""
    async with loopback_app(create_app(SimConfig(speed=50.0, api_key=KEY))) as url:
        yield url


# --- settings -------------------------------------------------------------------------
def test_the_key_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert build_config(environ={"PRISM_ENGINE_API_KEY": KEY}).engine_api_key == KEY
    key_file = tmp_path / "engine-key"
    key_file.write_text(KEY + "\n")  # as `echo` writes it: the newline is not the key's
    environ = {"PRISM_ENGINE_API_KEY_FILE": str(key_file)}
    assert build_config(environ=environ).engine_api_key == KEY
    flagged = parse_serve_args(["--engine-api-key-file", str(key_file)], environ={})
    assert flagged.engine_api_key == KEY
    assert build_config(environ={}).engine_api_key is None


def test_the_key_is_never_on_the_command_line_nor_in_a_log(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):  # no such flag
        parse_serve_args(["--engine-api-key", KEY], environ={})
    with pytest.raises(ConfigError, match="never given on the command line"):
        parse_serve_args(["--set", f"engine_api_key={KEY}"], environ={})
    # The control token neither: no flag, and refused through --set.
    with pytest.raises(SystemExit):
        parse_serve_args(["--control-token", "ctl"], environ={})
    with pytest.raises(ConfigError, match="never given on the command line"):
        parse_serve_args(["--set", "control_token=ctl"], environ={})
    config = build_config(environ={"PRISM_ENGINE_API_KEY": KEY, "PRISM_CONTROL_TOKEN": "ctl"})
    assert KEY not in repr(config) and "ctl" not in repr(config)


@pytest.mark.parametrize(
    ("environ", "error"),
    [
        ({"PRISM_ENGINE_API_KEY": KEY, "PRISM_ENGINE_API_KEY_FILE": "{file}"}, "give one"),
        ({"PRISM_ENGINE_API_KEY_FILE": "{missing}"}, "cannot read"),
        ({"PRISM_ENGINE_API_KEY_FILE": "{empty}"}, "is empty"),
        ({"PRISM_ENGINE_API_KEY": "two words"}, "without spaces"),
        ({"PRISM_ENGINE_API_KEY": "k\r\nX-Injected: 1"}, "printable ASCII"),
    ],
)
def test_a_bad_key_setting_stops_the_start(
    tmp_path: Path, environ: dict[str, str], error: str
) -> None:
    (tmp_path / "key").write_text(KEY)
    (tmp_path / "empty").write_text("\n")
    paths = {"file": tmp_path / "key", "missing": tmp_path / "nope", "empty": tmp_path / "empty"}
    environ = {name: value.format(**paths) for name, value in environ.items()}
    with pytest.raises(ConfigError, match=error):
        build_config(environ=environ)


def test_the_control_token_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    token_file = tmp_path / "control-token"
    token_file.write_text("ctl-t0ken\n")
    config = parse_serve_args(["--control-token-file", str(token_file)], environ={})
    assert config.control_token == "ctl-t0ken"
    config = parse_serve_args([], environ={"PRISM_CONTROL_TOKEN_FILE": str(token_file)})
    assert config.control_token == "ctl-t0ken"
    assert parse_serve_args([], environ={"PRISM_CONTROL_TOKEN": "t"}).control_token == "t"


def test_prism_sim_takes_its_secrets_from_the_environment_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prism_sim.cli import build_parser, config_from_args

    with pytest.raises(SystemExit):  # no such flag any more
        build_parser().parse_args(["--control-token", "ctl"])
    key_file = tmp_path / "engine-key"
    key_file.write_text(KEY + "\n")
    monkeypatch.setenv("PRISM_CONTROL_TOKEN", "ctl")
    monkeypatch.setenv("PRISM_ENGINE_API_KEY_FILE", str(key_file))
    sim = config_from_args(build_parser().parse_args([]))
    assert (sim.control_token, sim.api_key) == ("ctl", KEY)
    assert KEY not in repr(sim)


def test_prism_sim_stops_on_an_unusable_secret_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit status 2 and one line naming the setting, before anything listens."""
    from prism_sim.cli import main

    empty = tmp_path / "engine-key"
    empty.write_text("\n")
    monkeypatch.delenv("PRISM_ENGINE_API_KEY", raising=False)
    monkeypatch.setenv("PRISM_ENGINE_API_KEY_FILE", str(empty))
    assert main(["--port", "0"]) == 2
    assert capsys.readouterr().err == f"prism-sim: PRISM_ENGINE_API_KEY_FILE: {empty} is empty\n"


# --- through the proxy ------------------------------------------------------------------
async def test_every_path_carries_the_engines_key_and_never_the_clients(engine: str) -> None:
    """The tokenizer check's probes at start, the token path (chat, stream, completions,
    /generate) and the forwarded OpenAI path (a tool chat) all reach an engine that
    refuses a request without its key; each client sends its own, different key."""
    # Without the key the engine refuses the proxy's every call, and says so.
    async with httpx.AsyncClient(timeout=30.0) as http:
        refused = await http.post(engine + "/generate", json={"text": "hi"})
        assert refused.status_code == 401, refused.text
        wrong = {"Authorization": f"Bearer {CLIENT_KEY}"}
        refused = await http.post(engine + "/generate", json={"text": "hi"}, headers=wrong)
        assert refused.status_code == 401, refused.text

    async with running_proxy(engine, engine_api_key=KEY) as proxy:
        guard = proxy.app[GATEWAY].tokenizer_guard
        assert guard.tokenizer is not None  # the start's checks were answered
        async with openai.AsyncOpenAI(
            base_url=proxy.url + "/v1", api_key=CLIENT_KEY, max_retries=0
        ) as client:
            chat = await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
            assert chat.choices[0].message.content
            stream = await client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=4, stream=True
            )
            pieces = [c.choices[0].delta.content async for c in stream if c.choices]
            assert "".join(p for p in pieces if p)
            tool_chat = await client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=16, tools=[LOOKUP]
            )
            assert tool_chat.choices[0].finish_reason in ("stop", "length", "tool_calls")
            completion = await client.completions.create(model="m", prompt="Say:", max_tokens=3)
            assert completion.choices[0].text
        async with httpx.AsyncClient(timeout=30.0) as http:
            body = {"text": "Say:", "sampling_params": {"max_new_tokens": 3}}
            headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
            generated = await http.post(proxy.url + "/generate", json=body, headers=headers)
            assert generated.status_code == 200, generated.text
            assert generated.json()["text"]


async def test_a_proxy_without_the_key_is_refused_by_the_engine(engine: str) -> None:
    """The control case of the test above: without the key the proxy does not start
    (its tokenizer check is refused); started past that check (`builtin`, `forward`),
    every request is a 502 naming the refused credentials, not the client's 401 (a
    client's own key, even the engine's, is not forwarded)."""
    with pytest.raises(RuntimeError, match="refused the proxy's credentials"):
        async with running_proxy(engine):
            pass
    past_the_check = running_proxy(engine, tokenizer="builtin", tokenizer_mismatch="forward")
    async with past_the_check as proxy, httpx.AsyncClient(timeout=30.0) as http:
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 4}
        answer = await http.post(
            proxy.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},  # the right key, from a client
        )
        assert answer.status_code == 502, answer.text
        assert "refused the proxy's credentials" in answer.json()["error"]["message"]
