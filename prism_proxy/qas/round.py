"""Shared first steps of every policy's round: FIFO order and counters (SPEC §2)."""

from __future__ import annotations

from collections.abc import Sequence

from prism_proxy.qas.types import QueuedRequest


def fifo_order(queue: Sequence[QueuedRequest]) -> list[QueuedRequest]:
    """Queue in arrival order; equal arrivals keep their input order (stable)."""
    return sorted(queue, key=lambda q: q.arrival)
