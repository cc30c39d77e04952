"""The SGLang command lines of the deployment (docker-compose.yml, deploy/sglang.Dockerfile)
parse with SGLang 0.5.23's own argument parser once SGLang's plugin loader has loaded
PRISM's plugin (docs/deploy.md)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()  # registers the radix-cache backend `prism_dart` (entry point)
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def with_defaults(value: str) -> str:
    """Compose interpolation of `${NAME:-default}` with no variable set."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


KEYS = {"PRISM_ENGINE_API_KEY": "k3y", "PRISM_ENGINE_ADMIN_API_KEY": "adm1n"}


def test_compose_command_is_a_valid_sglang_command_with_dart() -> None:
    """The compose command, as the image's launcher (`backend_plugin.launch`) hands it to
    SGLang with the keys of the service's environment."""
    from backend_plugin.launch import build_argv

    service = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["sglang"]
    assert set(KEYS) <= set(service["environment"])  # the keys come from the environment
    argv = build_argv([with_defaults(str(a)) for a in service["command"]], dict(KEYS))
    args = sglang_parser().parse_args(argv)
    assert (args.api_key, args.admin_api_key) == ("k3y", "adm1n")
    assert args.radix_cache_backend == "prism_dart"
    assert args.enable_metrics is True
    assert args.incremental_streaming_output is True
    assert args.enable_cache_report is True
    assert args.incremental_streaming_output is True  # deltas per chunk (performance.md)
    assert args.model_path == "/models/Qwen3-4B-Instruct-2507"
    assert (args.host, args.port) == ("0.0.0.0", 30000)
    assert args.tp_size == 1  # the plugin refuses tp > 1


def test_the_env_examples_extra_args_give_sglang_its_host_tier_with_dart() -> None:
    """`SGLANG_EXTRA_ARGS` reaches the launcher as PRISM_SGLANG_EXTRA_ARGS; the HiCache
    example deploy/.env.example gives parses with SGLang's own parser, DART kept."""
    from backend_plugin.launch import EXTRA_ARGS, build_argv

    service = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["sglang"]
    assert service["environment"][EXTRA_ARGS] == "${SGLANG_EXTRA_ARGS:-}"
    example = (REPO / "deploy" / ".env.example").read_text()
    extra = re.search(r"^#\s+SGLANG_EXTRA_ARGS=(.+)$", example, re.MULTILINE).group(1)
    command = [with_defaults(str(a)) for a in service["command"]]
    args = sglang_parser().parse_args(build_argv(command, {**KEYS, EXTRA_ARGS: extra}))
    assert args.enable_hierarchical_cache is True
    assert args.hicache_ratio == 2.0
    assert args.hicache_write_policy == "write_through"
    assert args.radix_cache_backend == "prism_dart"
    assert args.api_key == "k3y"
    unset = sglang_parser().parse_args(build_argv(command, {**KEYS, EXTRA_ARGS: ""}))
    assert unset.enable_hierarchical_cache is False


def test_dockerfile_cmd_is_a_valid_sglang_command_with_dart() -> None:
    text = (REPO / "deploy" / "sglang.Dockerfile").read_text().replace("\\\n", " ")
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE).group(1))
    assert entrypoint == ["python3", "-m", "backend_plugin.launch"]
    from backend_plugin.launch import build_argv

    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.MULTILINE).group(1))
    args = sglang_parser().parse_args(build_argv([*cmd, "--model-path", "/models/m"], {}))
    assert args.api_key is None  # an open engine unless the keys are given
    assert args.radix_cache_backend == "prism_dart"
    assert args.enable_metrics is True
    assert args.incremental_streaming_output is True


def test_the_backend_the_deployment_selects_is_registered() -> None:
    """What the scheduler's `create_tree_cache` looks up for `--radix-cache-backend`: the
    deployment's name resolves to the plugin's factory; an unknown name does not."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory

    from backend_plugin.sglang_plugin import build_dart_cache

    sglang_parser()
    assert get_radix_cache_factory("prism_dart") is build_dart_cache
    assert get_radix_cache_factory("no_such_backend") is None
