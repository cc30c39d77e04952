"""The simulated engine's scheduler: SGLang-like continuous batching (SPEC §7).

Pure and synchronous: the caller passes modeled time in, asks for the next batch with
`next_batch(now)`, lets the batch's `duration_s` pass, then calls
`complete_batch(batch, now)`. `prism_sim.engine_loop` does that on an asyncio task.

One loop iteration, as SGLang's `get_next_batch_to_run`:
* **Prefill first.** If requests wait (those with `arrival_s <= now`) or a chunked
  prompt is unfinished, and the running batch has room, build a prefill batch: the
  unfinished chunk first, then waiting requests in policy order while the batch's
  token budget (`chunked_prefill_size`, counted in uncached tokens),
  `max_running_requests` and KV memory allow. A request longer than what is left of
  the budget is cut (chunked prefill) and continues in the next prefill batch; the first
  request that does not fit in memory stops the batch.
* **Otherwise decode** one token for every running request.

KV accounting (`capacity = tree tokens + held tokens + free`):
* admission matches `input_ids[:-1]` (SGLang keeps one token to compute logits), locks
  the matched path and records `cached_tokens`; it must fit its whole uncached prompt
  plus its remaining decode tokens into `capacity − protected − held − reserved`,
  where `reserved` is what admitted requests may still allocate (decode tokens, the
  rest of a chunked prompt), so decoding never runs out of memory (SGLang estimates
  the decode share with a decaying ratio; we reserve it all, which only matters under
  memory pressure);
* allocating tokens evicts unlocked tree nodes when the free pool is short;
* after each prefill chunk the computed prompt is inserted into the tree and the lock
  moves to its end; on finish (or abort) the prompt plus the generated tokens whose KV
  exists are inserted and the lock is released, so they stay cached but evictable.

`insert_hook(req, cache, key)` runs after every insertion of a request's tokens (DART
places its anchors there; `req.kv_hints` is the request's `kv_hints` unchanged).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prism_sim.batch import Batch, PrefillPart, SchedulerConfig, SchedulerStats
from prism_sim.host_tier import HostTier
from prism_sim.radix_cache import RadixCache
from prism_sim.request import SimRequest, Status
from prism_sim.schedule_policy import CACHE_AWARE_MAX_QUEUE, order_waiting
from prism_sim.time_model import PrefillItem, Profile, decode_time_s, prefill_time_s

__all__ = ["Batch", "InsertHook", "PrefillPart", "Scheduler", "SchedulerConfig", "SchedulerStats"]

InsertHook = Callable[[SimRequest, RadixCache, list[int]], None]


class Scheduler:
    """Waiting queue, running batch and KV pool around one radix cache."""

    def __init__(
        self,
        config: SchedulerConfig,
        profile: Profile,
        cache: RadixCache,
        filler_ids: Sequence[int],
        insert_hook: InsertHook | None = None,
        host_tier: HostTier | None = None,
    ) -> None:
        if not filler_ids:
            raise ValueError("filler_ids must not be empty")
        self.config = config
        self.profile = profile
        self.cache = cache
        self.filler_ids = list(filler_ids)
        self.insert_hook = insert_hook
        # SGLang's hierarchical cache (`prism_sim.host_tier`); None: device only.
        self.host_tier = host_tier
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.inflight: Batch | None = None
        self.held_tokens_total = 0
        self.stats = SchedulerStats()
        self._by_rid: dict[str, SimRequest] = {}
        self._just_finished: list[SimRequest] = []
        # SGLang's `running_batch.batch_is_full`: set when admission stopped for lack of
        # slots or memory, cleared when a request leaves; prefill is not retried before.
        self.batch_is_full = False
        self._prefill_attempts = 0
        # Called once per request when it finishes or is aborted (metrics).
        self.on_finish: Callable[[SimRequest], None] | None = None

    # ----- requests in and out ------------------------------------------------------

    def add_request(self, req: SimRequest, now: float) -> None:
        """Queue a request; too long for the KV pool or duplicate rid → `ValueError`."""
        if not req.input_ids:
            raise ValueError("input_ids must not be empty")
        if req.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        need = len(req.input_ids) + req.max_new_tokens - 1
        if need > self.config.kv_capacity_tokens:
            raise ValueError(
                f"request needs {need} KV tokens, capacity is {self.config.kv_capacity_tokens}"
            )
        if req.rid in self._by_rid:
            raise ValueError(f"duplicate rid {req.rid!r}")
        req.arrival_s = now
        req.arrival_processed_tokens = self.stats.processed_prefill_tokens
        self._by_rid[req.rid] = req
        self.waiting.append(req)

    def abort(self, rid: str, now: float) -> bool:
        """Abort a waiting or running request; False when the rid is unknown/finished."""
        req = self._by_rid.get(rid)
        if req is None or req.finished:
            return False
        if req.status is Status.WAITING:
            self.waiting.remove(req)
            self._finish(req, now, {"type": "abort", "message": "Abort request."})
            return True
        req.abort_requested = True
        if not self._in_inflight(req):
            self._release(req, now, {"type": "abort", "message": "Abort request."})
        return True

    def fail_all(self, now: float, message: str) -> None:
        """Finish every live request with an abort (the engine loop crashed)."""
        for req in list(self._by_rid.values()):
            req.status = Status.FINISHED
            req.finish_s = now
            req.finish_reason = {"type": "abort", "message": message}
            req.notify()
        self._by_rid.clear()
        self.waiting.clear()
        self.running.clear()
        self.chunked = None
        self.inflight = None

    def next_arrival_after(self, now: float) -> float | None:
        """Earliest arrival time of a waiting request that has not arrived by `now`."""
        future = [r.arrival_s for r in self.waiting if r.arrival_s > now]
        return min(future) if future else None

    def get(self, rid: str) -> SimRequest | None:
        return self._by_rid.get(rid)

    def live_requests(self) -> list[SimRequest]:
        """Every request not finished yet: waiting, in a prefill batch, chunked, running."""
        return list(self._by_rid.values())

    def flush_cache(self) -> bool:
        """Empty the tree; refused (False) while any request is waiting or running."""
        if self.waiting or self.running or self.chunked is not None or self.inflight:
            return False
        self.cache.reset()
        if self.host_tier is not None:
            self.host_tier.host.reset()
        return True

    # ----- accounting ----------------------------------------------------------------

    @property
    def used_tokens(self) -> int:
        return self.cache.evictable_size() + self.cache.protected_size() + self.held_tokens_total

    @property
    def num_running(self) -> int:
        return len(self.running) + (1 if self.chunked is not None else 0)

    def _reserved_tokens(self) -> int:
        """Tokens admitted requests may still allocate: every decode token still to come,
        and the rest of the chunked prompt."""
        reserved = sum(r.remaining_decode_tokens for r in self.running)
        if self.chunked is not None:
            reserved += self.chunked.remaining_decode_tokens
            reserved += self.chunked.unallocated_prompt_tokens
        return reserved

    def _available_tokens(self, reserved: int) -> int:
        """Tokens a new admission may still take (evictable tokens count as free)."""
        return (
            self.config.kv_capacity_tokens
            - self.cache.protected_size()
            - self.held_tokens_total
            - reserved
        )

    def _alloc(self, req: SimRequest, num_tokens: int) -> None:
        free = self.config.kv_capacity_tokens - self.used_tokens
        if free < num_tokens:
            self.cache.evict(num_tokens - free)
            free = self.config.kv_capacity_tokens - self.used_tokens
            if free < num_tokens:
                self.stats.kv_overcommit_tokens += num_tokens - free
        req.held_tokens += num_tokens
        self.held_tokens_total += num_tokens

    # ----- batches -------------------------------------------------------------------

    def next_batch(self, now: float) -> Batch | None:
        """Build the next batch (prefill has priority) or None when idle."""
        if self.inflight is not None:
            raise RuntimeError("complete_batch() the in-flight batch first")
        batch = self._prefill_batch(now)
        if batch is None and self.running:
            reqs = tuple(self.running)
            for req in reqs:
                self._alloc(req, 1)
            batch = Batch("decode", now, decode_time_s(self.profile, len(reqs)), decode_reqs=reqs)
        self.inflight = batch
        return batch

    def _prefill_batch(self, now: float) -> Batch | None:
        if self.batch_is_full and self.chunked is None:
            return None  # before scanning the queue: under overload this is most steps
        arrived = [r for r in self.waiting if r.arrival_s <= now]
        if not arrived and self.chunked is None:
            return None
        if self.chunked is None and len(self.running) >= self.config.max_running_requests:
            self.batch_is_full = True
            return None
        budget = self.config.chunked_prefill_size or 1 << 62
        parts: list[PrefillPart] = []
        if self.chunked is not None:
            req = self.chunked
            take = min(len(req.input_ids) - req.fill_len, budget)
            self._alloc(req, take)
            parts.append(PrefillPart(req, take))
            budget -= take
        new_chunked: SimRequest | None = None
        reserved = self._reserved_tokens()  # grows with each admission below
        hit_tokens = 0
        new_prompt_tokens = 0
        ordered = order_waiting(
            self.config.schedule_policy,
            arrived,
            self.cache,
            self.stats.processed_prefill_tokens,
        )
        self._maybe_refresh_waiting_prefixes(arrived)
        for req in ordered:
            if budget <= 0 or new_chunked is not None:
                break
            if len(self.running) + len(parts) >= self.config.max_running_requests:
                self.batch_is_full = True
                break
            match = self.cache.match_prefix(req.input_ids[:-1])
            host_hit = 0
            if self.host_tier is not None:
                # SGLang's host_hit_length: host-only tokens past the device prefix,
                # loaded back into device slots at admission (`init_load_back`)
                host_len = self.host_tier.match(req.input_ids[:-1])
                host_hit = max(0, host_len - match.prefix_len)
            prefix_len = match.prefix_len + host_hit
            extend = len(req.input_ids) - prefix_len
            self.cache.inc_lock_ref(match.last_node)
            take = min(extend, budget)
            # The whole prompt must fit, not only this chunk (SGLang's PrefillAdder);
            # a load-back needs device slots for what it loads as well.
            if host_hit + extend + req.remaining_decode_tokens > self._available_tokens(reserved):
                self.cache.dec_lock_ref(match.last_node)
                # SGLang stops trying prefills until a running request leaves (if any).
                self.batch_is_full = bool(parts or self.running)
                break
            reserved += req.remaining_decode_tokens + (extend - take)
            self.waiting.remove(req)
            req.status = Status.PREFILLING
            req.admitted_s = now
            req.cached_tokens = prefix_len  # SGLang counts host hits in cached_tokens
            req.host_hit_tokens = host_hit
            req.host_loading_tokens = host_hit
            req.fill_len = prefix_len
            req.protected_len = match.prefix_len
            req.last_node = match.last_node
            self._alloc(req, host_hit + take)
            parts.append(PrefillPart(req, take, host_hit))
            budget -= take
            hit_tokens += prefix_len
            new_prompt_tokens += len(req.input_ids)
            self.stats.prompt_tokens_total += len(req.input_ids)
            self.stats.cached_tokens_total += prefix_len
            self.stats.host_hit_tokens_total += host_hit
            if take < extend:
                new_chunked = req
        if not parts:
            return None
        if new_prompt_tokens:
            self.stats.last_prefill_hit_rate = hit_tokens / new_prompt_tokens
        if new_chunked is not None:
            self.chunked = new_chunked
        items = [PrefillItem(p.extend_tokens, p.req.fill_len + p.extend_tokens) for p in parts]
        duration = prefill_time_s(self.profile, items)
        load_tokens = sum(p.load_tokens for p in parts)
        if load_tokens and self.host_tier is not None:
            # the H2D copy of the host hits, charged before the forward (upper bound:
            # SGLang overlaps it layer by layer, `prism_sim.host_tier`)
            load_s = self.host_tier.load_time_s(load_tokens)
            self.stats.host_load_s_total += load_s
            duration += load_s
        return Batch("prefill", now, duration, parts=tuple(parts))

    def _maybe_refresh_waiting_prefixes(self, arrived: list[SimRequest]) -> None:
        """SGLang 0.5.23's waiting-prefix refresh (FCFS order, LRU eviction): every 32nd
        prefill attempt, touch the cached prefixes of the first 128 waiting requests,
        head last, so LRU evicts them in reverse admission order."""
        cache_aware = (
            self.config.schedule_policy != "fcfs" and len(arrived) <= CACHE_AWARE_MAX_QUEUE
        )
        if not self.config.waiting_prefix_refresh or cache_aware or not arrived:
            return
        refresh = self._prefill_attempts % 32 == 0
        self._prefill_attempts += 1
        if refresh:
            for req in reversed(arrived[:128]):
                self.cache.match_prefix(req.input_ids + req.output_ids)

    def complete_batch(self, batch: Batch, now: float) -> list[SimRequest]:
        """Apply a batch's results at modeled time `now`; returns the requests it finished."""
        if batch is not self.inflight:
            raise RuntimeError("not the in-flight batch")
        self.inflight = None
        self._just_finished = []
        if batch.kind == "prefill":
            self.stats.prefill_steps += 1
            for part in batch.parts:
                self._complete_prefill(part, now)
        else:
            self.stats.decode_steps += 1
            for req in batch.decode_reqs:
                if req.finished:
                    continue
                self._emit_token(req, now)
        finished, self._just_finished = self._just_finished, []
        return finished

    def _complete_prefill(self, part: PrefillPart, now: float) -> None:
        req = part.req
        req.host_loading_tokens = 0  # the loaded slots are filled now
        self.stats.processed_prefill_tokens += part.extend_tokens
        req.fill_len += part.extend_tokens
        if req.abort_requested:
            self._release(req, now, {"type": "abort", "message": "Abort request."})
            return
        if req.fill_len < len(req.input_ids):
            self._cache_unfinished(req)  # a middle chunk: publish it, keep it locked
            return
        if self.chunked is req:
            self.chunked = None
        req.status = Status.RUNNING
        self.running.append(req)
        self._emit_token(req, now)  # may finish it (max_new_tokens == 1): then released
        if not req.finished:
            self._cache_unfinished(req)

    def _emit_token(self, req: SimRequest, now: float) -> None:
        if req.abort_requested:
            self._release(req, now, {"type": "abort", "message": "Abort request."})
            return
        script, done = req.output_script, len(req.output_ids)
        token = self.filler_ids[done % len(self.filler_ids)] if script is None else script[done]
        req.output_ids.append(token)
        self.stats.generation_tokens_total += 1
        if req.first_token_s is None:
            req.first_token_s = now
        if script is not None and len(req.output_ids) == len(script):
            # SGLang's FINISH_MATCHED_TOKEN: the script ends with its stop token
            self._release(req, now, {"type": "stop", "matched": token})
        elif len(req.output_ids) >= req.max_new_tokens:
            self._release(req, now, {"type": "length", "length": req.max_new_tokens})
        else:
            req.notify()

    # ----- tree bookkeeping ------------------------------------------------------------

    def _cache_unfinished(self, req: SimRequest) -> None:
        """Insert the computed prompt and move the lock to its end (SGLang's
        `checkpoint` of a running request)."""
        key = req.input_ids[: req.fill_len]
        self._insert(req, key)
        match = self.cache.match_prefix(key)
        assert match.prefix_len == len(key)
        self._drop_held(req, len(key) - req.protected_len)
        self.cache.inc_lock_ref(match.last_node)
        if req.last_node is not None:
            self.cache.dec_lock_ref(req.last_node)
        req.last_node = match.last_node
        req.protected_len = len(key)
        if self.insert_hook is not None:
            self.insert_hook(req, self.cache, key)

    def _insert(self, req: SimRequest, key: list[int]) -> None:
        """Insert `key` for `req`, splitting at the prompt end when outputs follow it
        (SGLang's `_insert_cache(split_prompt=True)`, prompt priority + 1)."""
        priority = req.priority or 0
        self.cache.insert(key, priority, inserted_len=req.cache_inserted_len)
        if self.host_tier is not None:
            self.host_tier.backup(key)  # write_through: every new node goes to host
        req.cache_inserted_len = max(req.cache_inserted_len, len(key))
        prompt_len = len(req.input_ids)
        if 0 < prompt_len < len(key):
            self.cache.insert(key[:prompt_len], priority + 1, inserted_len=prompt_len)

    def _drop_held(self, req: SimRequest, num_tokens: int) -> None:
        num_tokens = min(num_tokens, req.held_tokens)
        req.held_tokens -= num_tokens
        self.held_tokens_total -= num_tokens

    def _release(self, req: SimRequest, now: float, reason: dict[str, object]) -> None:
        """Finish a request: cache its committed tokens, free its slots, unlock
        (SGLang's `release_kv_cache(checkpoint=True)`)."""
        key = req.kv_committed_tokens
        if key:
            self._insert(req, key)
            self.cache.match_prefix(key)  # SGLang's checkpoint re-matches the key
            if self.insert_hook is not None:
                self.insert_hook(req, self.cache, key)
        self._drop_held(req, req.held_tokens)
        if req.last_node is not None:
            self.cache.dec_lock_ref(req.last_node)
            req.last_node = None
        if req in self.running:
            self.running.remove(req)
        if self.chunked is req:
            self.chunked = None
        self.batch_is_full = False  # a request left: admission may succeed again
        self._finish(req, now, reason)

    def _finish(self, req: SimRequest, now: float, reason: dict[str, object]) -> None:
        req.status = Status.FINISHED
        req.finish_s = now
        req.finish_reason = dict(reason)
        if reason.get("type") == "abort":
            self.stats.num_aborted_total += 1
        else:
            self.stats.num_requests_total += 1
        self._just_finished.append(req)
        self._by_rid.pop(req.rid, None)
        if self.on_finish is not None:
            self.on_finish(req)
        req.notify()

    def _in_inflight(self, req: SimRequest) -> bool:
        batch = self.inflight
        if batch is None:
            return False
        if batch.kind == "prefill":
            return any(p.req is req for p in batch.parts)
        return req in batch.decode_reqs
