"""A stand-in `sgl_kernel` for SGLang 0.5.23 on a CPU without AMX (docs/sglang-cpu.md).

Why it exists: with `SGLANG_USE_CPU_ENGINE=1`, several SGLang modules import CPU kernels
from `sgl_kernel` at module level (`if _is_cpu: from sgl_kernel import …`). Neither
kernel wheel on PyPI (`sgl-kernel` 0.3.21, `sglang-kernel` 0.4.10) ships CPU ops, and
SGLang only uses its CPU kernels on CPUs with AMX; without AMX every layer runs its
`forward_native` path. So only the names imported at module level are needed:

* `assign_req_to_token_pool_cpu` is called for every prefill
  (`sglang/srt/mem_cache/allocation.py`): it gets a pure-torch body below;
* the others belong to speculative decoding and KV-cache moves, which a plain server
  never runs: calling one raises NotImplementedError instead of computing garbage.

The launcher (`sglang_cpu.serve`) puts this package's directory on the
server's `PYTHONPATH`; nothing installs it into an environment.
"""

from __future__ import annotations

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the request→token table.

    Same contract as the Triton kernel `assign_req_to_token_pool` beside its caller:
    request i's slots `out_cache_loc[Σ_{j<i} (end_j − start_j) : …]` go to
    `req_to_token[req_pool_indices[i], start_i:end_i]`.
    """
    del pool_len  # the row width; slicing needs no bound check of its own
    offset = 0
    for index, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        length = end - start
        req_to_token[index, start:end] = out_cache_loc[offset : offset + length]
        offset += length


def _not_on_this_cpu(name: str):
    def kernel(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            f"sgl_kernel.{name} is a stand-in (sglang_cpu/shims): "
            "this CPU path has no kernel for it (speculative decoding, KV moves)"
        )

    kernel.__name__ = name
    return kernel


copy_all_layer_kv_cache_cpu = _not_on_this_cpu("copy_all_layer_kv_cache_cpu")
build_tree_kernel_efficient_cpu = _not_on_this_cpu("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _not_on_this_cpu("verify_tree_greedy_cpu")
assign_draft_cache_locs_contiguous_cpu = _not_on_this_cpu("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _not_on_this_cpu("assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = _not_on_this_cpu("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _not_on_this_cpu("fill_bonus_tokens_cpu")
