"""Serving the application through the proxy's server: `ProxyRunner`, an aiohttp
`AppRunner` whose server is `edge.server.ProxyServer`, and `listen`.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from prism_proxy.edge.connection_policy import ConnectionPolicy
from prism_proxy.edge.server import ProxyServer

NEVER_S = 10 * 365 * 86400.0  # aiohttp's keep-alive timer, disarmed (the clock keeps time)


class ProxyRunner(web.AppRunner):
    """An `AppRunner` serving its application through `ProxyServer`."""

    __slots__ = ("_access_log", "_policy")

    def __init__(
        self,
        app: web.Application,
        policy: ConnectionPolicy,
        *,
        shutdown_timeout: float,
        access_log: logging.Logger | None = None,
    ) -> None:
        super().__init__(app, shutdown_timeout=shutdown_timeout)
        self._policy = policy
        self._access_log = access_log

    async def _make_server(self) -> web.Server:
        app_server = await super()._make_server()  # starts the application
        return ProxyServer(
            app_server.request_handler,
            policy=self._policy,
            request_factory=app_server.request_factory,
            loop=asyncio.get_running_loop(),
            access_log=self._access_log,
            keepalive_timeout=NEVER_S,
        )


async def listen(runner: web.AppRunner, host: str, port: int) -> str:
    """Listen on `host:port` (port 0: any free port); returns the base URL."""
    await web.TCPSite(runner, host, port).start()
    bound_host, bound_port = runner.addresses[-1][:2]
    if ":" in bound_host:
        bound_host = f"[{bound_host}]"
    return f"http://{bound_host}:{bound_port}"
