"""The plugin's settings, read from the environment in this one place.

PRISM_DART_POLICY      dart | lru | lru+active | lfu          (default dart)
PRISM_DART_PROTECT     protection budget f before the first push (default 8)
PRISM_DART_PROTECT_FRACTION
                       most of the KV pool the protected owners F_t may hold, in
                       [0, 1] (default 0.25)
PRISM_CONTROL_PORT     control RPC port of dp rank 0; rank r listens on port + r
                       (unset: no control RPC)
PRISM_CONTROL_HOST     bind address (default 127.0.0.1)
PRISM_CONTROL_TOKEN    bearer token the RPC requires
PRISM_CONTROL_TOKEN_FILE
                       a file holding it (give one of the two)
PRISM_CONTROL_OPEN=1   run the RPC without a token (explicit opt-in; loopback only)
PRISM_CONTROL_ALLOW_REMOTE=1
                       allow a bind address other than loopback (explicit opt-in;
                       the token is then required)
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass

from backend_plugin.dart.keys import EvictionPolicy
from backend_plugin.dart.priority import (
    DEFAULT_HOST_ORDER,
    DEFAULT_PROTECT,
    DEFAULT_PROTECT_FRACTION,
    DEFAULT_RETAIN_FRACTION,
    HOST_ORDERS,
)
from prism_wire.secret import SecretError, read_secret

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
    allow_remote: bool = False

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port < 65536:
            raise ControlConfigError(f"control port out of range: {self.port}")

    @property
    def loopback(self) -> bool:
        """Whether the bind address is loopback only (a name other than `localhost` is
        taken as reachable from elsewhere)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def check_auth(self) -> None:
        """Refuse an unauthenticated RPC unless it was asked for explicitly, and any RPC
        on a non-loopback address unless that was asked for too (then with a token)."""
        if not self.loopback:
            if not self.allow_remote:
                raise ControlConfigError(
                    f"the PRISM control RPC binds to loopback unless asked: host {self.host!r}"
                    " needs PRISM_CONTROL_ALLOW_REMOTE=1"
                )
            if not self.token:
                raise ControlConfigError(
                    f"the PRISM control RPC on {self.host!r} (not loopback) needs a token"
                    " (PRISM_CONTROL_TOKEN or PRISM_CONTROL_TOKEN_FILE); PRISM_CONTROL_OPEN"
                    " applies to loopback only"
                )
        if not self.token and not self.allow_open:
            raise ControlConfigError(
                "the PRISM control RPC needs a token (PRISM_CONTROL_TOKEN or"
                " PRISM_CONTROL_TOKEN_FILE); set PRISM_CONTROL_OPEN=1 to run it without"
                " authentication"
            )


@dataclass(frozen=True, slots=True)
class PluginConfig:
    policy: EvictionPolicy = EvictionPolicy.DART
    protect: int = DEFAULT_PROTECT
    control: ControlConfig = ControlConfig()
    protect_fraction: float = DEFAULT_PROTECT_FRACTION
    retain_fraction: float = DEFAULT_RETAIN_FRACTION
    host_order: str = DEFAULT_HOST_ORDER

    def __post_init__(self) -> None:
        if self.protect < 0:
            raise ValueError(f"PRISM_DART_PROTECT must be >= 0, got {self.protect}")
        if not 0.0 <= self.protect_fraction <= 1.0:
            raise ValueError(
                f"PRISM_DART_PROTECT_FRACTION must be in [0, 1], got {self.protect_fraction}"
            )
        if not 0.0 <= self.retain_fraction <= 1.0:
            raise ValueError(
                f"PRISM_DART_RETAIN_FRACTION must be in [0, 1], got {self.retain_fraction}"
            )
        if self.host_order not in HOST_ORDERS:
            raise ValueError(
                f"PRISM_DART_HOST_ORDER must be one of {', '.join(HOST_ORDERS)}, "
                f"got {self.host_order!r}"
            )


def control_token(env: Mapping[str, str]) -> str | None:
    """PRISM_CONTROL_TOKEN, or the text of the file PRISM_CONTROL_TOKEN_FILE names
    (without surrounding whitespace), else None. Never a flag: a command line is
    readable by every local user."""
    try:
        return read_secret(env, "PRISM_CONTROL_TOKEN")
    except SecretError as exc:
        raise ControlConfigError(str(exc)) from None


def load_config(env: Mapping[str, str] | None = None) -> PluginConfig:
    """Build the settings from `env` (default: the process environment)."""
    env = os.environ if env is None else env
    port = env.get("PRISM_CONTROL_PORT")
    return PluginConfig(
        policy=EvictionPolicy(env.get("PRISM_DART_POLICY", EvictionPolicy.DART.value)),
        protect=int(env.get("PRISM_DART_PROTECT", DEFAULT_PROTECT)),
        protect_fraction=float(env.get("PRISM_DART_PROTECT_FRACTION", DEFAULT_PROTECT_FRACTION)),
        retain_fraction=float(env.get("PRISM_DART_RETAIN_FRACTION", DEFAULT_RETAIN_FRACTION)),
        host_order=env.get("PRISM_DART_HOST_ORDER", DEFAULT_HOST_ORDER),
        control=ControlConfig(
            port=int(port) if port else None,
            host=env.get("PRISM_CONTROL_HOST", DEFAULT_CONTROL_HOST),
            token=control_token(env),
            allow_open=env.get("PRISM_CONTROL_OPEN", "") == "1",
            allow_remote=env.get("PRISM_CONTROL_ALLOW_REMOTE", "") == "1",
        ),
    )
