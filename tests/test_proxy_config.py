"""ProxyConfig: flag > PRISM_* env > config file > default (configuration)."""

from __future__ import annotations

import json

import pytest

from prism_proxy.admission.sessions import SessionParams
from prism_proxy.config import AUTOMATIC, ConfigError
from prism_proxy.config_sources import parse_serve_args
from prism_proxy.options import FLAGS, options


def test_defaults_without_any_source() -> None:
    config = parse_serve_args([], environ={})
    assert (config.port, config.policy, config.window_ms, config.tokenizer) == (
        8000,
        "prism",
        10.0,
        "auto",
    )
    assert config.qas.q_cold == 2 and config.qas.f_front == 3
    # the session table's defaults are the table's own (the twin builds it without a config)
    assert config.session_params() == SessionParams()


def test_precedence_flag_over_env_over_file(tmp_path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(
        'max_inflight = 7\nwindow_ms = 3.5\npolicy = "klpm"\n[qas]\nk = 4\nq_cold = 1\n'
    )
    env = {"PRISM_CONFIG": str(path), "PRISM_WINDOW_MS": "2.5", "PRISM_Q_COLD": "3"}
    config = parse_serve_args(["--policy", "fifo"], environ=env)
    assert config.policy == "fifo"  # flag beats file
    assert config.window_ms == 2.5  # env beats file
    assert config.max_inflight == 7  # file beats default
    assert config.qas.q_cold == 3 and config.qas.k == 4  # env > file for QAS parameters too


def test_json_config_file_and_flag_path(tmp_path) -> None:
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps({"max-queue": 5, "control_url": "http://127.0.0.1:1"}))
    config = parse_serve_args(["--config", str(path), "--set", "beta_util=0.25"], environ={})
    assert config.max_queue == 5
    assert config.control_url == "http://127.0.0.1:1"
    assert config.qas.beta_util == 0.25


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        ([], {"PRISM_MAX_INFLIGHT": "many"}, "max_inflight"),
        (["--policy", "lru"], {}, "policy"),
        (["--set", "max_inflight=-1"], {}, "max_inflight"),
        ([], {"PRISM_K": "0"}, "k"),
        # more segments than a hint's prompt may hold would be refused later, not here
        (["--set", "max_segments=257"], {}, "max_segments: at most 256"),
        (["--set", "session_default_ttl_s=0"], {}, "default_ttl_s must be > 0"),
        (["--set", "session_min_ttl_s=90"], {}, "min_ttl_s <= max_ttl_s"),
    ],
)
def test_bad_values_name_the_setting(argv, env, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_serve_args(argv, environ=env)


def test_unknown_file_key_is_rejected(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("max_inflihgt = 3\n")
    with pytest.raises(ConfigError, match="max_inflihgt"):
        parse_serve_args(["--config", str(path)], environ={})


def test_every_setting_has_flag_and_env_names() -> None:
    names = {option.name for option in options()}
    assert {"backend", "max_inflight", "window_ms", "max_queue", "control_url"} <= names
    assert {"f_front", "kappa", "q_cold", "alpha_size", "beta_util", "w_a", "k"} <= names
    flags = [option.flag for option in options()]
    assert len(flags) == len(set(flags))
    assert all(option.env.startswith("PRISM_") for option in options())


def test_docs_list_every_setting_with_its_default() -> None:
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "proxy.md").read_text()
    rows = {
        line.split("|")[1].split("`")[1]: line
        for line in doc.splitlines()
        if line.startswith("| `") and "`PRISM_" in line
    }
    for option in options():
        row = rows.get(option.key)
        assert row is not None, f"docs/proxy.md lacks {option.key}"
        assert f"`{option.env}`" in row
        assert (f"(`{option.flag}`)" in row) == (option.name in FLAGS), option.key
        if option.default is None:
            shown = "`auto`" if option.name in AUTOMATIC else "unset"
        else:
            shown = f"`{option.default}`"
        assert shown in row, f"{option.key}: default {shown} not in docs"
