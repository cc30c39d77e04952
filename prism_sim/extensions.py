"""Engine extensions: eviction orders that need more than `get_priority` (DART, SPEC §3).

An extension is chosen by the `--eviction` name. It supplies the eviction strategy,
attaches to the engine's cache (splits, eviction passes, evicted nodes), observes every
insertion of a request's tokens (to place anchors from `req.kv_hints`), and may run a
resource for the server's lifetime (the control RPC). Names map to a module exposing
`create_extension(config) -> EngineExtension` (imported on first use, so `prism_sim`
never imports the plugin unless asked), or are registered directly with
`register_extension`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prism_sim.radix_cache import RadixCache
    from prism_sim.request import SimRequest

# The DART module lives in the backend plugin package; the simulator runs it.
EXTENSION_MODULES: dict[str, str] = {
    "dart": "backend_plugin.sim_extension",
    "lru+active": "backend_plugin.sim_extension",
}


class EngineExtension(Protocol):
    """What an eviction extension provides to the simulated engine."""

    strategy: Any  # an `EvictionStrategy`

    def attach(self, cache: RadixCache) -> None:
        """Called once with the engine's cache: register its listeners (splits, eviction
        passes, evicted nodes)."""

    def on_insert(self, req: SimRequest, cache: RadixCache, key: list[int]) -> None:
        """After `key` (a prefix of the request's tokens) was inserted; may split nodes."""

    # Optional: `on_finish(req)` is called once when a request finishes or is aborted;
    # `attach_host(cache)` once with the host tier's tree of copies (`prism_sim.host_tier`)
    # when the engine has one, before any request.

    def lifecycle(self, engine: Any) -> AbstractAsyncContextManager[None]:
        """Entered when the server starts, exited when it stops (e.g. a control RPC)."""
        ...


ExtensionFactory = Callable[[Any], EngineExtension]
_FACTORIES: dict[str, ExtensionFactory] = {}


def register_extension(name: str, factory: ExtensionFactory) -> None:
    """Make `--eviction <name>` build `factory(config)`."""
    _FACTORIES[name.lower()] = factory


def load_extension(name: str, config: Any) -> EngineExtension | None:
    """The extension for eviction `name`, or None when `name` is a plain strategy."""
    key = name.lower()
    if key not in _FACTORIES and key in EXTENSION_MODULES:
        module = importlib.import_module(EXTENSION_MODULES[key])
        return module.create_extension(config)
    factory = _FACTORIES.get(key)
    return factory(config) if factory is not None else None
