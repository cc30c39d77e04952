"""SGLang's real classes on CPU (marker `sglang`, environment `.venv-sglang`).

In an environment without sglang (the core `.venv`) these modules are not collected at
all. Otherwise, before anything imports sglang, register the two torchvision operators
the CUDA-linked torchvision wheel fails to provide on a CPU-only torch (SGLANG-NOTES),
then import the sglang modules the tests use once, with the import-time warnings of
unrelated GPU-only modules ("Only CUDA ... support AWQ") silenced; the test run itself
keeps `filterwarnings = error`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path

# The core suite's shared test data (tests/hostile_bodies.py) is read here too.
sys.path.append(str(Path(__file__).resolve().parent.parent))

collect_ignore_glob: list[str] = []

if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    from sglang_cpu import torchvision_shim

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torchvision_shim.register()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sglang.srt.mem_cache.radix_cache
        import sglang.srt.mem_cache.registry
        import sglang.srt.plugins
        import sglang.srt.server_args  # noqa: F401

    import pytest

    @pytest.fixture(scope="session")
    def published_server_args(tmp_path_factory):
        """SGLang's process-wide config as a scheduler process publishes it, with the
        plugins loaded through SGLang's own loader and `--radix-cache-backend prism_dart`."""
        from sglang.srt import runtime_context
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import ServerArgs
        from sglang_support import write_tiny_model

        load_plugins()
        model = write_tiny_model(tmp_path_factory.mktemp("tiny-model"))
        server_args = ServerArgs(
            model_path=str(model), radix_cache_backend="prism_dart", device="cpu"
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runtime_context.publish(
                server_args, role="scheduler", ranks=runtime_context.SpawnRanks(world_rank=0)
            )
        return server_args

    @pytest.fixture(scope="session")
    def live(tmp_path_factory):
        """The real SGLang servers of `live_support.SPECS`, started once per session."""
        from live_support import live_servers

        with live_servers(tmp_path_factory.mktemp("sglang-logs")) as servers:
            yield servers

    @pytest.fixture
    async def live_proxy_factory():
        """Start in-process proxies (prism, DART pushes) in front of live servers."""
        from live_support import proxy_for

        started = []

        async def start(live_server, **overrides):
            proxy = await proxy_for(live_server, **overrides)
            started.append(proxy)
            return proxy

        yield start
        for proxy in started:
            await proxy.stop()
