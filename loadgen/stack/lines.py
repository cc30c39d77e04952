"""The lines of an experiment: one `Line` is one setup compared with the others, and the
real stack's settings follow from it.

A line says what runs: a proxy policy, or no proxy (native SGLang), or a third party's
server in the proxy's place; the engine's eviction order and schedule policy; the
proxy's QAS variant and parameters, its prefill batch and its session features; and
SGLang's host tier. Each experiment keeps a table of named lines and derives from a
line what it starts:

* on the real stack, prism-sim's settings (`line_engine_settings`) and the proxy's
  (`line_proxy_settings`), which the launcher (`processes.engine_args`, `proxy_args`)
  turns into command lines, beside the experiment's own (pool, speed, ports, backend);
* in the twin, its `TwinSetup` and `SessionFeatures` (`loadgen.twin.lines`).

The sweep's lines (SPEC §5) are named here and written as specs (`spec_line`):

* Proxy policies (`fifo`, `klpm`, `contextpilot-style`, `prism`): the engine behind the
  proxy runs FCFS; the baselines on LRU eviction, `prism` on DART with the control RPC.
  `contextpilot-style` is the proxy's own re-implementation of ContextPilot's ordering
  (`prism_proxy.qas.baselines`).
* Peer lines: a third party's own server beside the same engine (FCFS, LRU), with its
  own reordering and index (`loadgen.stack.peer_lines`): `contextpilot-real` in front of
  it (the client sends it plain chat), `contextpilot-rag` asked by the client for each
  request's document order (ContextPilot's documented RAG usage). Not in the default
  set, since they need `make peers` (and the first a layout it acts on).
* Native SGLang (`sglang-fcfs`, `sglang-lpm`, `sglang-hrrn`): no proxy in the path; the
  client sends each prompt serialized in its own order (`--api native`), and the
  engine's `--schedule-policy` orders them, on LRU: what a user would run instead.
* Ablations, written as a line spec `name[key=value;...]` (`LINE_KEYS`, read by
  `loadgen.stack.processes.parse_line`): another eviction order
  (`prism[eviction=lru]`), cold-lane quota (`prism[q_cold=4]`), a QAS variant
  (`prism[qas=paper]`), and any proxy policy at a fixed prefill batch `B`
  (`fifo[prefill_batch=16]`). Plain `prism` runs the sweep's QAS variant (`--set qas=...`, by
  default the proxy's default). The spec is the line's label.

agent_sessions' lines are `loadgen.experiments.session_lines`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from loadgen.stack.processes import parse_line
from prism_proxy.config import ProxyConfig
from prism_proxy.qas.params import QAS_VARIANTS, QasParams, qas_params

PROXY_BASELINES = ("fifo", "klpm", "contextpilot-style")
NATIVE = ("sglang-fcfs", "sglang-lpm", "sglang-hrrn")
PEER_LINES = ("contextpilot-real", "contextpilot-rag")  # loadgen.stack.peer_lines.PEER_SERVERS
BASELINES = (*PROXY_BASELINES, *NATIVE, *PEER_LINES)
POLICIES = (*PROXY_BASELINES, "prism")
ALL_POLICIES = (*POLICIES, *NATIVE)  # the sweep's default lines
KNOWN_LINES = (*ALL_POLICIES, *PEER_LINES)
# What a line spec may set: the engine's eviction order, and the proxy's q_cold, QAS
# variant and fixed prefill batch B.
LINE_KEYS = ("eviction", "q_cold", "qas", "prefill_batch")

Pairs = tuple[tuple[str, Any], ...]  # settings as (name, value) pairs, in order

# The session table's times in the proxy's config, at their defaults (seconds of the
# proxy's clock; `line_proxy_settings` scales them to the engine's at a speed).
SESSION_TIMES = {
    field.name: field.default
    for field in fields(ProxyConfig)
    if field.name.startswith("session_") and field.name.endswith("_s")
}
# The session rank that knows each paused session's true return time: a bound the twin
# alone can run (it knows when each tool will have run), no proxy's rank.
KNOWN_RETURNS = "known"


@dataclass(frozen=True)
class Line:
    """One line of an experiment, named by `label` in its results and reports.

    The proxy runs `policy` (None: no proxy; the client talks to the engine, or to
    `peer`, a `PEER_LINES` server in the proxy's place). The engine evicts by `eviction`
    (with `eviction_config`: SGLang's --radix-eviction-policy-config) and orders by
    `schedule_policy`. QAS runs variant `qas` (None: the experiment's) with
    `qas_overrides` on top (`q_cold`, `continuation_share`, `backlog_ms`, `age_cap_ms`:
    times in modeled ms); `prefill_batch` fixes B (None: the proxy's own rule).

    The session features: `detect` continuations and `retain` paused sessions in DART,
    ranked by `session_rank` (`KNOWN_RETURNS`: by the true return times, in the twin
    only), retention asked from `session_retain_from` (None: the session table's
    defaults), with `session_overrides` on top (the table's parameters
    by name, such as `ttl_quantile`; times in modeled seconds). `detect` and `retain`
    None: not set, so the proxy keeps its default and the twin runs without them (the
    sweep's lines, whose traces have no sessions). `hicache` turns SGLang's hierarchical
    cache on (`prism_sim.host_tier`), `hicache_ratio` and `hicache_bandwidth_gbps` None:
    its defaults."""

    label: str
    policy: str | None = None
    peer: str | None = None
    eviction: str = "lru"
    eviction_config: Pairs = ()
    schedule_policy: str = "fcfs"
    qas: str | None = None
    qas_overrides: Pairs = ()
    prefill_batch: int | None = None
    detect: bool | None = None
    retain: bool | None = None
    session_rank: str | None = None
    session_retain_from: str | None = None
    session_overrides: Pairs = ()
    hicache: bool = False
    hicache_ratio: float | None = None
    hicache_bandwidth_gbps: float | None = None

    @property
    def pushes_priorities(self) -> bool:
        """Only `prism` sends P̂_t to DART's control RPC."""
        return self.policy == "prism"

    @property
    def control_rpc(self) -> bool:
        """Whether the line's proxy talks to DART's control RPC: `prism` pushes P̂_t, and
        a line that retains paused sessions asks DART to keep them."""
        return self.pushes_priorities or bool(self.retain)


def base_line(name: str) -> Line:
    """The plain line of a sweep name (`prism`, `fifo`, `sglang-lpm`, ...)."""
    if name in NATIVE:
        return Line(name, schedule_policy=name.removeprefix("sglang-"))
    if name in POLICIES:
        return Line(name, policy=name, eviction="dart" if name == "prism" else "lru")
    if name in PEER_LINES:
        return Line(name, peer=name)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(KNOWN_LINES)}")


def spec_line(spec: str) -> Line:
    """The line of a spec: a name (`base_line`), or a name with settings among
    `LINE_KEYS` (`prism[eviction=lru;q_cold=4]`), labelled by the spec itself.
    ValueError for an unknown name or key, or a setting the line cannot take."""
    name, settings = parse_line(spec)
    base = base_line(name)
    if not settings:
        return base
    unknown = sorted(set(settings) - set(LINE_KEYS))
    if unknown:
        raise ValueError(
            f"line {spec!r}: unknown {', '.join(unknown)}; keys: {', '.join(LINE_KEYS)}"
        )
    proxy_keys = set(settings) - {"eviction"}
    if proxy_keys and base.policy is None:
        raise ValueError(f"line {spec!r}: {', '.join(sorted(proxy_keys))} needs a proxy line")
    if ({"q_cold", "qas"} & proxy_keys) and base.policy != "prism":
        raise ValueError(f"line {spec!r}: q_cold and qas are prism's")
    qas = settings.get("qas")
    if qas is not None and qas not in QAS_VARIANTS:
        raise ValueError(f"unknown QAS variant {qas!r}; choose from {', '.join(QAS_VARIANTS)}")
    label = f"{name}[{';'.join(f'{key}={value}' for key, value in settings.items())}]"
    prefill_batch = settings.get("prefill_batch")
    return replace(
        base,
        label=label,
        eviction=settings.get("eviction", base.eviction),
        qas=qas,
        qas_overrides=(("q_cold", int(settings["q_cold"])),) if "q_cold" in settings else (),
        prefill_batch=None if prefill_batch is None else int(prefill_batch),
    )


def spec_lines(specs: list[str]) -> tuple[Line, ...]:
    """The lines of a comparison, one per spec, in order (`spec_line`)."""
    return tuple(spec_line(spec) for spec in specs)


def line_qas(line: Line, qas: str | None = None, overrides: Pairs = ()) -> QasParams:
    """The QAS parameters `line`'s proxy runs: its variant, else the experiment's `qas`
    (None: `QasParams`' own defaults, the paper's), the experiment's `overrides` on
    prism lines, then the line's own overrides."""
    variant = line.qas or qas
    given = dict(overrides) if line.pushes_priorities else {}
    given |= dict(line.qas_overrides)
    return qas_params(variant, given) if variant else QasParams.from_overrides(given)


def line_engine_settings(line: Line, *, at_defaults: bool = True) -> dict[str, Any]:
    """prism-sim's settings for `line`, by their names (None: not set): the eviction
    order and its config, the schedule policy, the host tier. `at_defaults=False`
    leaves out those not set or equal to prism-sim's defaults, for a shorter command
    line."""
    settings: dict[str, Any] = {
        "eviction": line.eviction,
        "schedule_policy": line.schedule_policy,
        "radix_eviction_policy_config": (
            json.dumps(dict(line.eviction_config)) if line.eviction_config else None
        ),
        "enable_hierarchical_cache": line.hicache,
        "hicache_ratio": line.hicache_ratio,
        "hicache_bandwidth_gbps": line.hicache_bandwidth_gbps,
    }
    if at_defaults:
        return settings
    from prism_sim.engine import SimConfig  # the engine's defaults, only when asked

    defaults = {field.name: field.default for field in fields(SimConfig)}
    return {
        key: value
        for key, value in settings.items()
        if value is not None and value != defaults[key]
    }


def line_proxy_settings(
    line: Line, *, qas: str | None = None, qas_overrides: Pairs = (), speed: float = 1.0
) -> dict[str, Any]:
    """The proxy's settings for `line` (its config keys; None: not set), in order: the
    policy, the QAS variant (the line's, else the experiment's `qas` on prism lines), the
    session features with the line's `session_overrides`, the experiment's
    `qas_overrides` (on prism lines, as given), the line's own QAS overrides, the
    prefill batch. QAS times (`*_ms`: the variant's, the experiment's and the line's)
    and the session table's (`session_*_s`, the line's or the defaults) are in modeled
    time and the proxy's clock is the wall's: at a `speed` other than 1 (the engine's
    clock rate) every QAS time in force on a prism line, and every session time, is
    given, divided by `speed`, so that a deadline of 2 s or a paused session's longest
    time-to-live of 60 s means that much of the engine's time, as in the twin.
    ValueError for session features the proxy cannot set (it detects and retains
    together, by `sessions`; a table parameter without a `session_` setting; the
    `KNOWN_RETURNS` rank)."""
    if line.policy is None:
        raise ValueError(f"line {line.label!r} has no proxy")
    if line.session_rank == KNOWN_RETURNS:
        raise ValueError(f"line {line.label!r} knows return times: the twin's bound, no proxy's")
    prism = line.pushes_priorities
    settings: dict[str, Any] = {"policy": line.policy, "qas": line.qas or (qas if prism else None)}
    if line.detect is not None or line.retain is not None:
        if line.detect != line.retain:
            raise ValueError(f"line {line.label!r}: the proxy detects and retains together")
        settings["sessions"] = line.detect
    settings["session_rank"] = line.session_rank
    settings["session_retain_from"] = line.session_retain_from
    overrides = {f"session_{name}": value for name, value in line.session_overrides}
    unknown = sorted(set(overrides) - {field.name for field in fields(ProxyConfig)})
    if unknown:
        raise ValueError(f"line {line.label!r}: the proxy has no {', '.join(unknown)}")
    for name, default in SESSION_TIMES.items():  # in the engine's time
        if speed != 1.0 or name in overrides:
            settings[name] = overrides.pop(name, default) / speed
    settings |= overrides
    if prism:
        settings |= dict(qas_overrides)
    for name, value in line.qas_overrides:
        settings[name] = value / speed if name.endswith("_ms") else value
    if prism and speed != 1.0:
        params = asdict(line_qas(line, qas, qas_overrides))
        for name, value in params.items():
            if name.endswith("_ms") and value:
                settings[name] = value / speed
    settings["prefill_batch"] = line.prefill_batch
    return settings
