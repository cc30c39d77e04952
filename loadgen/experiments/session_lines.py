"""The lines of the agent_sessions experiments, by name: `LINES`, every one, run in the
twin (`session_sweep`), and `REAL_LINES`, those the real stack runs (`session_real`)
with the same settings. Each is a `Line` (`loadgen.stack.lines`); the twin's setup and
the real stack's settings both come from it.

    sglang-lru, sglang-lpm,    SGLang's own scheduler (fcfs, lpm, hrrn) and LRU, no
    sglang-hrrn                proxy
    sglang-slru, sglang-tlru   SGLang's other multi-turn eviction policies
    fifo                       the proxy in arrival order
    continuum-style            program-level FCFS, every paused session pinned for its
                               TTL through DART (rank `program`), no P̂_t
    prism                      QAS and DART without the session features
    prism+sessions             with them at their defaults: continuations recognised,
                               paused sessions retained (rank `recent`)
    prism+sessions/lru         the same QAS with LRU in the engine (DART's half off)
    prism+sessions+precedence  and continuations first in QAS's hot lane
                               (`continuation_share` 0.5)
    prism+precedence           precedence without retention
    prism+sessions+returns     retention by predicted return (rank `predicted`)
    .../lpm                    the proxy's line with SGLang's lpm order over what it
                               releases; /lpm-unpaced: over every request (no pacing);
                               /hrrn-unpaced: SGLang's hrrn order over every request
    prism+sessions+returns+backlog
                               and under a backlog (the oldest request waited 1 s) the
                               longest cached prefix first, within an age cap of 8 s
                               (`backlog_ms`, `age_cap_ms`); /cap16: a cap of 16 s
    .../call                   retention asked when the stream shows the tool call,
                               not at the answer's end (`retain_from` "call")
    sglang-lru+host, prism+sessions+returns+host
                               those lines with SGLang's hierarchical cache on at its
                               defaults (`prism_sim.host_tier`); sglang-lru+host/ratio1:
                               a host pool of 1 × the device pool, /ratio4 (both
                               lines) 4 × instead of SGLang's 2 ×; /ttl300: paused
                               sessions kept up to 300 s, not 60; /q99: for the 0.99
                               quantile of their delays, not 0.9; /8gbps: loads at
                               8 GB/s instead of 25; prism+sessions+returns/unpaced+host
                               and /lpm-unpaced+host: with it, no pacing (the engine's
                               FCFS or lpm order over every request); /lru+host: with
                               it, SGLang's LRU eviction instead of DART's order;
                               prism+sessions+returns+backlog+host: the backlog rule
                               with it
    prism+sessions+known+host  a bound, twin only: prism+sessions+returns+host with
                               the true return times in place of the predicted ones
                               (rank and time-to-live); prism+sessions+known: without
                               the host tier; /ttl3600: kept up to the longest
                               time-to-live DART takes, not 60 s; /ratio4: on a host
                               pool of 4 × the device pool

The KV pool is each run's own (a fraction of the live sessions' unique KV), so it is no
part of a line.
"""

from __future__ import annotations

from dataclasses import replace

from loadgen.stack.lines import KNOWN_RETURNS, Line
from prism_wire import MAX_RETAIN_TTL_S

# T-LRU's budget: a conversation keeps only what holds its next prefill within this
# many uncached tokens (SGLang's `threshold`), its next prompt estimated at the median
# tool call plus tool output (`next_prompt_estimate`).
TLRU_CONFIG = (("threshold", 2048), ("next_prompt_estimate", 700))

NATIVE = Line("sglang-lru")
OFF = {"detect": False, "retain": False}
ON = {"detect": True, "retain": True}
RETURNS = {**ON, "session_rank": "predicted"}
KNOWN = {**ON, "session_rank": KNOWN_RETURNS}
AT_CALL = {**RETURNS, "session_retain_from": "call"}
PRISM = Line("prism", policy="prism", eviction="dart", qas="full", **OFF)
PRECEDENCE = (("continuation_share", 0.5),)
# the backlog rule: from a wait of 1 s, within an age cap of 8 s (modeled time)
BACKLOG = (("backlog_ms", 1000.0), ("age_cap_ms", 8000.0))
BACKLOG_CAP16 = (("backlog_ms", 1000.0), ("age_cap_ms", 16_000.0))


def _named(*lines: Line) -> dict[str, Line]:
    return {line.label: line for line in lines}


LINES = _named(
    NATIVE,
    replace(NATIVE, label="sglang-lpm", schedule_policy="lpm"),
    replace(NATIVE, label="sglang-hrrn", schedule_policy="hrrn"),
    replace(NATIVE, label="sglang-slru", eviction="slru"),
    replace(NATIVE, label="sglang-tlru", eviction="tlru", eviction_config=TLRU_CONFIG),
    Line("fifo", policy="fifo", **OFF),
    Line(
        "continuum-style", policy="continuum-style", eviction="dart", **ON, session_rank="program"
    ),
    PRISM,
    replace(PRISM, label="prism+sessions", **ON),
    replace(PRISM, label="prism+sessions+returns", **RETURNS),
    replace(PRISM, label="prism+sessions+returns+precedence", qas_overrides=PRECEDENCE, **RETURNS),
    replace(PRISM, label="prism+sessions+returns+backlog", qas_overrides=BACKLOG, **RETURNS),
    replace(
        PRISM, label="prism+sessions+returns+backlog/cap16", qas_overrides=BACKLOG_CAP16, **RETURNS
    ),
    replace(PRISM, label="prism+sessions+returns/call", **AT_CALL),
    replace(PRISM, label="prism+sessions+returns+backlog/call", qas_overrides=BACKLOG, **AT_CALL),
    # the engine's own longest-prefix-match order over every request (no pacing)
    replace(
        PRISM,
        label="prism+sessions+returns/lpm-unpaced",
        schedule_policy="lpm",
        prefill_batch=1024,
        **RETURNS,
    ),
    # the engine's highest-response-ratio order (the longest prefix first, aged by the
    # prefill work done since a request arrived) over every request
    replace(
        PRISM,
        label="prism+sessions+returns/hrrn-unpaced",
        schedule_policy="hrrn",
        prefill_batch=1024,
        **RETURNS,
    ),
    # the engine's longest-prefix-match order over what the proxy releases (paced)
    replace(PRISM, label="prism+sessions+returns/lpm", schedule_policy="lpm", **RETURNS),
    replace(
        PRISM,
        label="prism+sessions+returns+backlog/lpm",
        schedule_policy="lpm",
        qas_overrides=BACKLOG,
        **RETURNS,
    ),
    replace(PRISM, label="prism+sessions/lru", eviction="lru", **ON),
    replace(PRISM, label="prism+sessions+precedence", qas_overrides=PRECEDENCE, **ON),
    replace(PRISM, label="prism+precedence", qas_overrides=PRECEDENCE, detect=True),
    # SGLang's hierarchical cache at its defaults (host pool 2 × device, write
    # through, PCIe 4.0 loads; `prism_sim.host_tier`) under the same lines
    replace(NATIVE, label="sglang-lru+host", hicache=True),
    replace(PRISM, label="prism+sessions+returns+host", hicache=True, **RETURNS),
    # with the host tier, no pacing: the engine's own order (FCFS, or longest prefix
    # first) over every request the proxy sees
    replace(
        PRISM,
        label="prism+sessions+returns/unpaced+host",
        hicache=True,
        prefill_batch=1024,
        **RETURNS,
    ),
    # with the host tier, the proxy's line over SGLang's LRU eviction (DART's order off)
    replace(
        PRISM, label="prism+sessions+returns/lru+host", hicache=True, eviction="lru", **RETURNS
    ),
    replace(
        PRISM,
        label="prism+sessions+returns/lpm-unpaced+host",
        hicache=True,
        schedule_policy="lpm",
        prefill_batch=1024,
        **RETURNS,
    ),
    # with the host tier, the backlog rule (the longest cached prefix first under a
    # backlog, within the age cap)
    replace(
        PRISM,
        label="prism+sessions+returns+backlog+host",
        hicache=True,
        qas_overrides=BACKLOG,
        **RETURNS,
    ),
    # the same with a host pool only as large as the device pool, and with a third
    # of the PCIe 4.0 rate (a Gen3 or shared link)
    replace(NATIVE, label="sglang-lru+host/ratio1", hicache=True, hicache_ratio=1.0),
    replace(NATIVE, label="sglang-lru+host/8gbps", hicache=True, hicache_bandwidth_gbps=8.0),
    # a host pool of 4 × the device pool (SGLang's --hicache-ratio 4), for both lines
    replace(NATIVE, label="sglang-lru+host/ratio4", hicache=True, hicache_ratio=4.0),
    replace(
        PRISM,
        label="prism+sessions+returns+host/ratio4",
        hicache=True,
        hicache_ratio=4.0,
        **RETURNS,
    ),
    # paused sessions kept up to 300 s instead of 60, or for the 0.99 quantile of their
    # return delays instead of 0.9 (host memory holds what the device does not)
    replace(
        PRISM,
        label="prism+sessions+returns+host/ttl300",
        hicache=True,
        session_overrides=(("max_ttl_s", 300.0),),
        **RETURNS,
    ),
    replace(
        PRISM,
        label="prism+sessions+returns+host/ratio4/q99",
        hicache=True,
        hicache_ratio=4.0,
        session_overrides=(("ttl_quantile", 0.99),),
        **RETURNS,
    ),
    replace(
        PRISM,
        label="prism+sessions+returns+host/q99",
        hicache=True,
        session_overrides=(("ttl_quantile", 0.99),),
        **RETURNS,
    ),
    # the twin's bound on retention: each paused session ranked and timed by when it
    # will really be back (no proxy knows that)
    replace(PRISM, label="prism+sessions+known", **KNOWN),
    replace(PRISM, label="prism+sessions+known+host", hicache=True, **KNOWN),
    replace(
        PRISM,
        label="prism+sessions+known+host/ttl3600",
        hicache=True,
        session_overrides=(("max_ttl_s", MAX_RETAIN_TTL_S),),
        **KNOWN,
    ),
    replace(
        PRISM, label="prism+sessions+known+host/ratio4", hicache=True, hicache_ratio=4.0, **KNOWN
    ),
    replace(
        PRISM,
        label="prism+sessions+known+host/ratio4/ttl3600",
        hicache=True,
        hicache_ratio=4.0,
        session_overrides=(("max_ttl_s", MAX_RETAIN_TTL_S),),
        **KNOWN,
    ),
)

REAL_LINES = {
    name: LINES[name]
    for name in (
        "sglang-lru",
        "sglang-lpm",
        "sglang-hrrn",
        "prism",
        "prism+sessions",
        "prism+sessions+returns",
        "prism+sessions+returns+backlog",
        "prism+sessions+returns/lpm-unpaced",
        "prism+sessions+returns/hrrn-unpaced",
        "continuum-style",
        "sglang-lru+host",
        "prism+sessions+returns+host",
    )
}
