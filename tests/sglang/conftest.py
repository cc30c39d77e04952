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
import warnings

collect_ignore_glob: list[str] = []

if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    _lib = torch.library.Library("torchvision", "DEF")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

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
