"""SGLang's hierarchical cache (HiCache) host tier for the simulated engine (SPEC §7).

What SGLang 0.5.23 does (`mem_cache/unified_radix_cache.py`,
`unified_cache/unified_tree_core.py`, `unified_cache/components/full.py`,
`arg_groups/fields/memory.py`), and what is mirrored here:

* `--enable-hierarchical-cache` adds a host KV pool of `--hicache-ratio` (default 2.0)
  × the device pool, or `--hicache-size` GB (`hicache_hook.handle_hicache_ratio_default`);
* `--hicache-write-policy write_through` (the default) backs a node up to host when its
  hit count reaches `write_through_threshold` = 1 (`write_through_selective`: 2), i.e.
  every node at the insert that creates it (`_should_backup_after_insert`,
  `_inc_hit_count_and_check`); the copy is written asynchronously (D2H), so it costs
  no forward time;
* a backup that finds the host pool full first evicts host leaves: nodes that are no
  longer on the device, hold a host copy, have no children and no lock
  (`_is_host_leaf`), smallest `eviction_strategy.get_priority` first
  (`FullComponent.drive_host_eviction`); if that cannot make room the backup fails;
* a device eviction of a backed-up node frees its device slots and keeps the node, with
  its host copy, in the tree; a node without a host copy is deleted;
* `match_prefix` walks through device nodes and then host-only nodes: the device
  prefix, plus `host_hit_length` tokens on host; at admission `init_load_back`
  allocates device slots for them (evicting on device if needed) and queues the H2D
  copy, and the request's prefix then includes them (`req.prefix_len +=
  host_loaded_length`, `PrefillAdder`), so `cached_tokens` (= prefix − already computed,
  `schedule_batch.prepare_for_extend`) counts host hits, with `cached_tokens_host` as
  its host share.

Where the simulator differs, on purpose:
* the host copies live in a second radix tree (`host`, LRU) beside the device tree
  rather than as a second value on the same nodes; `write_through` is an insert of the
  same key into it, so its node boundaries may differ from the device tree's;
* a host leaf is "still on the device" when the device tree holds its whole path;
  those are skipped by host eviction as SGLang skips device-resident nodes; when only
  such copies are left, the oldest of them are dropped (SGLang would refuse the new
  backup instead: either way the data without a host copy is on the device);
* host eviction is LRU, as SGLang's is under LRU; an engine extension may give the
  host tree its own strategy (`attach_host`): DART does, with the owners its demoted
  nodes had, as SGLang's unified tree heaps host leaves with the device's strategy
  (`PRISM_DART_HOST_ORDER`, docs/dart-plugin.md); SGLang's other policies on host are
  not modeled;
* only `write_through` is modeled;
* the H2D copy is charged in full before the prefill that needs it
  (`host_load_time_s`); SGLang's kernel IO backend copies layer by layer and lets each
  layer's forward wait for its own layer (`LayerDoneCounter`), so the real cost lies
  between max(copy, compute) and copy + compute: this is the upper end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prism_sim.radix_cache import RadixCache, TreeNode

WRITE_POLICIES = ("write_through",)
DEFAULT_HICACHE_RATIO = 2.0
# Effective host→device copy rate of PCIe 4.0 x16 (the A800 SXM's host link): 31.5 GB/s
# per direction on the wire, about 25 GB/s for pinned-memory copies in practice.
DEFAULT_HICACHE_BANDWIDTH_GBPS = 25.0


@dataclass(frozen=True)
class HostTierConfig:
    """The host pool's size in tokens and the host→device copy rate."""

    capacity_tokens: int
    bytes_per_token: int
    bandwidth_bytes_per_s: float
    write_policy: str = "write_through"

    def __post_init__(self) -> None:
        if self.capacity_tokens <= 0:
            raise ValueError("the host pool must hold at least one token")
        if self.bytes_per_token <= 0:
            raise ValueError("the host tier needs the profile's kv_bytes_per_token")
        if self.bandwidth_bytes_per_s <= 0:
            raise ValueError("hicache bandwidth must be positive")
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"--hicache-write-policy {self.write_policy!r} is not modeled "
                f"(modeled: {', '.join(WRITE_POLICIES)})"
            )


def host_capacity_tokens(
    device_tokens: int, ratio: float, size_gb: float, bytes_per_token: int
) -> int:
    """SGLang's host pool size: `--hicache-size` GB when given (> 0), else `ratio` ×
    the device pool."""
    if size_gb > 0:
        return int(size_gb * 1e9) // bytes_per_token
    return int(ratio * device_tokens)


def host_load_time_s(tokens: int, bytes_per_token: int, bandwidth_bytes_per_s: float) -> float:
    """Seconds to copy `tokens` tokens of KV from host to device."""
    return tokens * bytes_per_token / bandwidth_bytes_per_s


def _resident_len(cache: RadixCache, key: list[int]) -> int:
    """How many leading tokens of `key` the tree holds (no access-time change)."""
    covered = 0
    for _node, start, end in cache.walk(key):
        if start != covered:
            break
        covered = min(end, len(key))
    return covered


class HostTier:
    """Host copies of the device tree's KV (write-through), bounded, LRU-evicted unless
    an extension orders them (`host.strategy`)."""

    def __init__(self, config: HostTierConfig, device: RadixCache) -> None:
        self.config = config
        self.device = device
        self.host = RadixCache("lru", clock=device.clock)
        self.backed_up_tokens_total = 0  # tokens written to host (D2H)
        self.host_evicted_tokens_total = 0
        self.failed_backup_tokens_total = 0  # dropped device-resident copies (see module)

    def size_tokens(self) -> int:
        return self.host.evictable_size() + self.host.protected_size()

    def backup(self, key: Sequence[int]) -> None:
        """Write-through: the device just inserted `key`; copy what host lacks."""
        already = self.host.insert(key)
        self.backed_up_tokens_total += len(key) - already
        over = self.size_tokens() - self.config.capacity_tokens
        if over <= 0:
            return
        freed = self.host.evict(over, skip=self._on_device).num_tokens_evicted
        self.host_evicted_tokens_total += freed
        if freed < over:
            rest = self.host.evict(over - freed).num_tokens_evicted
            self.failed_backup_tokens_total += rest

    def match(self, key: Sequence[int]) -> int:
        """Longest prefix of `key` held on host (refreshes its access times)."""
        return self.host.match_prefix(key).prefix_len

    def load_time_s(self, tokens: int) -> float:
        return host_load_time_s(
            tokens, self.config.bytes_per_token, self.config.bandwidth_bytes_per_s
        )

    def _on_device(self, leaf: TreeNode) -> bool:
        path = self.host.node_path_tokens(leaf)
        return _resident_len(self.device, path) == len(path)
