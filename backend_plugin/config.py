"""The plugin's settings, read from the environment in this one place.

PRISM_DART_POLICY      dart | lru | lru+active | lfu          (default dart)
PRISM_DART_PROTECT     protection budget f before the first push (default 8)
PRISM_CONTROL_PORT     control RPC port of dp rank 0; rank r listens on port + r
                       (unset: no control RPC)
PRISM_CONTROL_HOST     bind address (default 127.0.0.1)
PRISM_CONTROL_TOKEN    bearer token the RPC requires
PRISM_CONTROL_OPEN=1   run the RPC without a token (explicit opt-in)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from backend_plugin.dart.keys import EvictionPolicy
from backend_plugin.dart.priority import DEFAULT_PROTECT

DEFAULT_CONTROL_HOST = "127.0.0.1"


class ControlConfigError(ValueError):
    """The control RPC cannot start as configured."""


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """Where and how the control RPC listens."""

    port: int | None = None
    host: str = DEFAULT_CONTROL_HOST
    token: str | None = None
    allow_open: bool = False

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port < 65536:
            raise ControlConfigError(f"control port out of range: {self.port}")

    def check_auth(self) -> None:
        """Refuse an unauthenticated RPC unless it was asked for explicitly."""
        if not self.token and not self.allow_open:
            raise ControlConfigError(
                "the PRISM control RPC needs a token (PRISM_CONTROL_TOKEN / --control-token);"
                " set PRISM_CONTROL_OPEN=1 to run it without authentication"
            )


@dataclass(frozen=True, slots=True)
class PluginConfig:
    policy: EvictionPolicy = EvictionPolicy.DART
    protect: int = DEFAULT_PROTECT
    control: ControlConfig = ControlConfig()


def load_config(env: Mapping[str, str] | None = None) -> PluginConfig:
    """Build the settings from `env` (default: the process environment)."""
    env = os.environ if env is None else env
    port = env.get("PRISM_CONTROL_PORT")
    return PluginConfig(
        policy=EvictionPolicy(env.get("PRISM_DART_POLICY", EvictionPolicy.DART.value)),
        protect=int(env.get("PRISM_DART_PROTECT", DEFAULT_PROTECT)),
        control=ControlConfig(
            port=int(port) if port else None,
            host=env.get("PRISM_CONTROL_HOST", DEFAULT_CONTROL_HOST),
            token=env.get("PRISM_CONTROL_TOKEN") or None,
            allow_open=env.get("PRISM_CONTROL_OPEN", "") == "1",
        ),
    )
