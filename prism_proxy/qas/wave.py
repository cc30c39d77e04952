"""Hot and cold lanes of a dispatch wave (SPEC §2, dispatch wave).

    wave of M slots
    ┌──────────── hot: M − q_cold ────────────┬── cold: q_cold ──┐
    │ bucket 1 (FIFO) │ bucket 2 │ …          │ oldest unchosen  │
    └─────────────────────────────────────────┴──────────────────┘

Unused hot slots go to the cold lane (which takes the oldest requests not chosen); the
cold lane can only run short when the queue is exhausted, so the wave always holds
min(M, |queue|) requests.

Deadline lane (issue 13): requests past their admission deadline (`urgent`, earliest
deadline first) head the cold lane, ahead of the FIFO order; the caller grows q_cold
while they wait (`QasParams.cold_quota`). With one deadline target for all, earliest
deadline first is oldest first, so the deadline lane never passes over an older request.
"""

from __future__ import annotations

from collections.abc import Sequence

from prism_proxy.qas.buckets import Bucket, Member
from prism_proxy.qas.types import Lane, WaveEntry


def fill_wave(
    fifo: Sequence[Member],
    scan: Sequence[Bucket],
    wave_size: int,
    q_cold: int,
    urgent: Sequence[Member] = (),
) -> list[WaveEntry]:
    """Release order: hot lane bucket by bucket, then the cold lane: `urgent` first (in
    the order given), then the oldest."""
    wave_size = max(0, wave_size)
    hot_capacity = max(0, wave_size - q_cold)
    chosen: set[str] = set()
    wave: list[WaveEntry] = []
    for bucket in scan:
        for member in bucket.members:
            if len(wave) >= hot_capacity:
                break
            wave.append(WaveEntry(member.rid, Lane.HOT))
            chosen.add(member.rid)
        if len(wave) >= hot_capacity:
            break
    for member in (*urgent, *fifo):
        if len(wave) >= wave_size:
            break
        if member.rid not in chosen:
            wave.append(WaveEntry(member.rid, Lane.COLD))
            chosen.add(member.rid)
    return wave
