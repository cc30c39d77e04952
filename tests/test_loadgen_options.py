"""`prism-loadgen`'s options: the sweep's rarer settings as `--set KEY=VALUE`, several
seeds in `--seed`, agent_sessions' knobs as `--trace-param`, `sessions --real [SPEED]`,
and the measure of how many options there are (`bench.loadgen_options`). Each command
line goes through the real parser and the function the subcommand runs with it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.loadgen_options import measure, subcommands
from loadgen.cli import build_parser, main, session_params
from loadgen.experiments.sweep import SweepConfig, sweep_config_from_args
from loadgen.stack.lines import line_qas, spec_line
from prism_proxy.qas.params import qas_params


def _sweep(*flags: str, engine: str = "twin") -> SweepConfig:
    command = "simulate" if engine == "twin" else "sweep"
    args = build_parser().parse_args([command, "--out", "unused", *flags])
    return sweep_config_from_args(args, engine)


def test_each_set_key_reaches_its_sweep_setting() -> None:
    default = _sweep()
    config = _sweep(
        "--set", "qas=paper",
        "--set", "window_ms=2.5",
        "--set", "profile=cpu-smollm2",
        "--set", "kv-capacity-tokens=100000",  # dashes read as underscores
        "--set", "tokenizer=some/dir",
        "--set", "client_api=openai",
        "--set", "layout=tool",
        "--set", "model=smollm2",
        "--set", "sglang_python=/x/python",
    )  # fmt: skip
    assert (config.qas, default.qas) == ("paper", "full")
    assert (config.window_ms, default.window_ms) == (2.5, 10.0)
    assert (config.profile, default.profile) == ("cpu-smollm2", "a800-qwen3-4b")
    assert (config.kv_capacity_tokens, default.kv_capacity_tokens) == (100000, None)
    assert (config.tokenizer, default.tokenizer) == ("some/dir", "builtin")
    assert (config.client_api, default.client_api) == ("openai", "prism")
    assert (config.layout, default.layout) == ("tool", "blank")
    assert (config.model, default.model) == ("smollm2", "tiny")
    assert (config.sglang_python, default.sglang_python) == ("/x/python", ".venv-sglang/bin/python")
    assert config.qas_overrides == default.qas_overrides == ()


def test_a_qas_parameter_is_set_on_every_prism_line_only() -> None:
    config = _sweep(
        "--policies", "fifo,prism,prism[qas=paper]",
        "--set", "qas.cold_deadline_ms=1000", "--set", "qas.w_c=0",
    )  # fmt: skip
    assert config.qas_overrides == (("cold_deadline_ms", 1000.0), ("w_c", 0.0))
    prism, paper, fifo = spec_line("prism"), spec_line("prism[qas=paper]"), spec_line("fifo")
    overrides = {"cold_deadline_ms": 1000, "w_c": 0}
    assert line_qas(prism, config.qas, config.qas_overrides) == qas_params("full", overrides)
    assert line_qas(paper, config.qas, config.qas_overrides) == qas_params("paper", overrides)
    assert line_qas(fifo, config.qas, config.qas_overrides) == qas_params("full")


def test_a_wrong_setting_is_refused_naming_the_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match=r"'q_cold' is not a sweep setting .*window_ms"):
        _sweep("--set", "q_cold=4")  # a line's own setting: prism[q_cold=4]
    with pytest.raises(ValueError, match="choose from prism, openai"):
        _sweep("--set", "client_api=sglang")
    with pytest.raises(ValueError, match="is not key=value"):
        _sweep("--set", "qas")
    out = tmp_path / "twin"
    assert main(["simulate", "--out", str(out), "--set", "window=5"]) == 2
    assert "'window' is not a sweep setting" in capsys.readouterr().err
    assert not out.exists()


def test_seed_takes_one_seed_or_several() -> None:
    one = _sweep("--seed", "3")
    assert (one.seed, one.seeds, one.seed_list) == (3, (), (3,))
    several = _sweep("--seed", "2,0,1")
    assert (several.seed, several.seeds) == (2, (2, 0, 1))
    with pytest.raises(ValueError, match="listed twice"):
        _sweep("--seed", "1,1")


def test_the_twin_has_no_wall_clock_or_backend_options() -> None:
    parser = build_parser()
    for flag in ("--speed", "--backend", "--sim-arg", "--proxy-arg"):
        with pytest.raises(SystemExit):
            parser.parse_args(["simulate", "--out", "x", flag, "1"])
    real = _sweep("--speed", "4", "--backend", "sglang-cpu", engine="sim")
    assert (real.speed, real.backend) == (4.0, "sglang-cpu")


def _sessions(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["sessions", "--out", "unused", *flags])


def test_session_knobs_are_trace_params() -> None:
    args = _sessions(
        "--sessions", "7",
        "--trace-param", "tool_model=by_tool",
        "--trace-param", "source=synthetic",
        "--trace-param", "max_calls=9",
        "--trace-param", "tool-sigma=0.5",
    )  # fmt: skip
    params = session_params(args)
    assert (params.num_sessions, params.tool_model, params.source) == (7, "by_tool", "synthetic")
    assert (params.max_calls, params.tool_sigma) == (9, 0.5)
    plain = session_params(_sessions())
    assert (plain.tool_model, plain.source, plain.max_calls) == ("independent", "auto", 16)
    # The points' own knobs have their flags (--rate, --tool-scale), not a trace param.
    for name in ("session_rate", "tool_scale", "num_sessions", "nope"):
        with pytest.raises(ValueError, match=f"--trace-param {name}: not a knob"):
            session_params(_sessions("--trace-param", f"{name}=1"))
    with pytest.raises(ValueError, match="tool_model"):
        session_params(_sessions("--trace-param", "tool_model=fancy"))


def test_sessions_real_takes_its_speed() -> None:
    assert _sessions().real is None
    assert _sessions("--real").real == 4.0
    assert _sessions("--real", "8", "--rate", "1").real == 8.0
    assert _sessions("--rate", "1", "--real").real == 4.0


def test_the_measure_walks_nested_subcommands() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--top")
    sub = parser.add_subparsers()
    leaf = sub.add_parser("leaf")
    leaf.add_argument("--a", "-a")
    nest = sub.add_parser("nest").add_subparsers()
    nest.add_parser("x").add_argument("--b")
    nest.add_parser("y")
    assert subcommands(parser) == {
        "leaf": ["--top", "--a", "-a"],
        "nest x": ["--top", "--b"],
        "nest y": ["--top"],
    }


def test_prism_loadgen_has_at_most_90_options() -> None:
    tree = measure()
    assert {"trace rag", "trace agent", "sweep", "simulate", "sessions"} <= set(tree)
    assert {"quality", "scale-out"} <= set(tree)  # their own parsers, measured too
    assert "--front-proxy-arg" in tree["scale-out"] and "--rescore" in tree["quality"]
    assert "--set" in tree["sweep"] and "--qas" not in tree["sweep"]
    assert sum(map(len, tree.values())) <= 90
