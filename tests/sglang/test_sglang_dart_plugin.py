"""The plugin inside SGLang 0.5.23's real machinery: entry-point discovery by
`load_plugins()`, the `prism_dart` backend built by the scheduler's own
`create_tree_cache` from `ServerArgs`/`CacheInitParams`, the control RPC started with
the cache, and the refusals (tp > 1, no token)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import httpx
import pytest
import torch
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.registry import (
    TreeCacheBuildContext,
    create_tree_cache,
    get_radix_cache_factory,
    registered_radix_cache_backends,
)
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins, load_plugins_by_group
from sglang.srt.server_args import prepare_server_args
from sglang_support import MockAllocator, cache_params

from backend_plugin.config import ControlConfigError
from backend_plugin.sglang_cache import DartRadixCache
from backend_plugin.sglang_plugin import BACKEND_NAME, build_dart_cache
from loadgen.stack.processes import free_port

pytestmark = pytest.mark.sglang


def build_context(server_args, tp_size: int = 1, allocator=None) -> TreeCacheBuildContext:
    """What `mem_cache/kv_cache_builder.py` hands `create_tree_cache` on one GPU."""
    return TreeCacheBuildContext(
        server_args=server_args,
        params=cache_params(allocator or MockAllocator()),
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        tp_worker=None,
        model_config=None,
        tp_size=tp_size,
        tp_rank=0,
        tp_group=None,
    )


def test_sglang_plugin_loader_finds_and_runs_the_entry_point():
    points = {ep.name: ep.value for ep in entry_points(group=GENERAL_PLUGINS_GROUP)}
    assert points[BACKEND_NAME] == "backend_plugin.sglang_plugin:register"
    loaded = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert BACKEND_NAME in loaded
    load_plugins()
    assert BACKEND_NAME in registered_radix_cache_backends()
    assert get_radix_cache_factory(BACKEND_NAME) is build_dart_cache


def test_server_flag_accepts_the_backend(published_server_args):
    args = prepare_server_args(
        ["--model-path", published_server_args.model_path, "--radix-cache-backend", BACKEND_NAME]
    )
    assert args.radix_cache_backend == BACKEND_NAME


def test_scheduler_path_builds_the_dart_cache_and_its_control_rpc(
    published_server_args, monkeypatch
):
    port = free_port()
    monkeypatch.setenv("PRISM_CONTROL_PORT", str(port))
    monkeypatch.setenv("PRISM_CONTROL_TOKEN", "tok")
    monkeypatch.setenv("PRISM_DART_POLICY", "dart")
    monkeypatch.setenv("PRISM_DART_PROTECT_FRACTION", "0.5")
    # SGLang's own KV allocator: the cache bounds F_t by the pool's size it reports
    allocator = TokenToKVPoolAllocator(4096, torch.float32, "cpu", None, False)
    cache = create_tree_cache(build_context(published_server_args, allocator=allocator))
    try:
        assert type(cache) is DartRadixCache
        assert cache.dart.capacity_tokens == 4096 and cache.dart.protect_cap_tokens == 2048
        assert cache.control is not None and cache.control.port == port  # dp rank 0
        url = f"http://127.0.0.1:{port}"
        auth = {"Authorization": "Bearer tok"}
        body = {"epoch": 1, "table": {"A": 2.0}, "protect": 1}
        assert httpx.post(url + "/prism/priorities", json=body, headers=auth).status_code == 200
        assert httpx.post(url + "/prism/priorities", json=body, headers=auth).status_code == 409
        assert httpx.post(url + "/prism/priorities", json=body).status_code == 401
        assert cache.dart.table is None  # applied by the scheduler thread, not the RPC's
        cache.evict(EvictParams(num_tokens=0))
        assert cache.dart.table == {"A": 2.0}
        stats = httpx.get(url + "/prism/stats", headers=auth).json()
        assert stats["capacity_tokens"] == 4096 and stats["protect_cap_tokens"] == 2048
    finally:
        cache.control.stop()


def test_refuses_tensor_parallelism_and_an_unauthenticated_rpc(published_server_args, monkeypatch):
    with pytest.raises(ValueError, match="tp-size > 1"):
        create_tree_cache(build_context(published_server_args, tp_size=2))
    monkeypatch.setenv("PRISM_CONTROL_PORT", str(free_port()))
    monkeypatch.delenv("PRISM_CONTROL_TOKEN", raising=False)
    monkeypatch.delenv("PRISM_CONTROL_OPEN", raising=False)
    with pytest.raises(ControlConfigError, match="token"):
        create_tree_cache(build_context(published_server_args))


def test_with_hicache_the_backend_is_dart_on_sglangs_unified_tree(
    published_server_args, monkeypatch
):
    """`--enable-hierarchical-cache` routes the backend through SGLang's own
    `create_unified_radix_cache` with `DartUnifiedRadixCache`; SGLang's `init_hicache`
    then allocates the host pool, which on this CPU-only torch stops at its CUDA host
    registration (HiCache is GPU-only in 0.5.23; the tree is tested in
    test_sglang_dart_unified.py)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from backend_plugin.sglang_unified import DartTreeCore, DartUnifiedRadixCache

    kv = MHATokenToKVPool(256, 1, torch.float32, 2, 8, 2, "cpu", False)
    ctx = build_context(
        published_server_args,
        allocator=TokenToKVPoolAllocator(256, torch.float32, "cpu", kv, False),
    )
    ctx.enable_hierarchical_cache = True
    monkeypatch.setenv("PRISM_DART_HOST_ORDER", "lru")  # reaches the tree's DART core
    with pytest.raises(AssertionError, match="not compiled with CUDA") as info:
        create_tree_cache(ctx)
    hosts = [entry.locals.get("self") for entry in info.traceback]
    caches = [c for c in hosts if isinstance(c, DartUnifiedRadixCache)]
    assert caches and all(type(c.tree_core) is DartTreeCore for c in caches)
    assert all(c.dart.host_order == "lru" for c in caches)
    assert any(entry.name == "init_hicache" for entry in info.traceback)


def test_launcher_runs_sglangs_own_entry_point():
    """`python -m backend_plugin.launch` reaches SGLang's launch_server argument parser
    (with `--help` it stops there: no model can be served on this CPU-only machine)."""
    code = (
        "import torch\n"
        "lib = torch.library.Library('torchvision', 'DEF')\n"
        "lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')\n"
        "lib.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')\n"
        "from backend_plugin.launch import main\n"
        "main(['--help'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--radix-cache-backend" in done.stdout and "--tp-size" in done.stdout


def test_sglang_accepts_our_kv_hints_envelope_and_rejects_a_bare_dict():
    """What `/generate` does with `kv_hints` (GenerateReqInput normalization): the
    envelope built by `make_kv_hints` passes and reaches the scheduler as a
    `KvHintsEnvelope` the plugin reads; the bare `{"prism": ...}` form is a 400."""
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.kv_hints import KvHintsEnvelope

    from prism_wire import make_kv_hints, parse_kv_hints

    anchors = [
        {"kind": "system", "segment_id": None, "offset": 2},
        {"kind": "segment", "segment_id": "doc-1", "offset": 5},
        {"kind": "private", "segment_id": None, "offset": 7},
    ]
    ok = GenerateReqInput(
        input_ids=list(range(7)),
        rid="r1",
        kv_hints=make_kv_hints(anchors, {"doc-1": 3.0}, message_id="r1"),
    )
    ok.normalize_batch_and_arguments()
    assert isinstance(ok.kv_hints, KvHintsEnvelope)
    hints = parse_kv_hints(ok.kv_hints)
    assert [a.offset for a in hints.anchors] == [2, 5, 7]
    assert hints.segment_ids == {"doc-1"} and hints.priorities == {"doc-1": 3.0}
    bare = GenerateReqInput(input_ids=list(range(7)), rid="r2", kv_hints={"prism": {}})
    with pytest.raises(ValueError, match="Malformed kv_hints envelope"):
        bare.normalize_batch_and_arguments()
