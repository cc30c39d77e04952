"""The lines of a comparison: proxy policies, native SGLang, and PRISM's ablations
(SPEC §5).

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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from loadgen.stack.processes import parse_line
from prism_proxy.qas.params import QAS_VARIANTS

PROXY_BASELINES = ("fifo", "klpm", "contextpilot-style")
NATIVE = ("sglang-fcfs", "sglang-lpm", "sglang-hrrn")
PEER_LINES = ("contextpilot-real", "contextpilot-rag")  # loadgen.stack.peer_lines.PEER_SERVERS
BASELINES = (*PROXY_BASELINES, *NATIVE, *PEER_LINES)
POLICIES = (*PROXY_BASELINES, "prism")
ALL_POLICIES = (*POLICIES, *NATIVE)  # the default lines
KNOWN_LINES = (*ALL_POLICIES, *PEER_LINES)
# What a line spec may set: the engine's eviction order, and the proxy's q_cold, QAS
# variant and fixed prefill batch B.
LINE_KEYS = ("eviction", "q_cold", "qas", "prefill_batch")


@dataclass(frozen=True)
class Variant:
    """One line: a proxy policy (None: no proxy), the engine's eviction order and
    schedule policy, and the proxy's overrides (None: its defaults). `peer` names a
    third party's server that stands where the proxy would (policy None)."""

    label: str
    policy: str | None
    eviction: str
    q_cold: int | None = None
    schedule_policy: str = "fcfs"
    prefill_batch: int | None = None
    qas: str | None = None  # QAS variant (None: the sweep's)
    peer: str | None = None  # a PEER_LINES name: that server instead of a proxy

    @property
    def pushes_priorities(self) -> bool:
        """Only `prism` sends P̂_t to DART's control RPC."""
        return self.policy == "prism"


def base_variant(name: str) -> Variant:
    """The plain line of a policy name (`prism`, `fifo`, `sglang-lpm`, ...)."""
    if name in NATIVE:
        return Variant(name, None, "lru", schedule_policy=name.removeprefix("sglang-"))
    if name in POLICIES:
        return Variant(name, name, "dart" if name == "prism" else "lru")
    if name in PEER_LINES:
        return Variant(name, None, "lru", peer=name)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(KNOWN_LINES)}")


def line_variant(spec: str) -> Variant:
    """The line of a spec: a name (`base_variant`), or a name with settings among
    `LINE_KEYS` (`prism[eviction=lru;q_cold=4]`), labelled by the spec itself.
    ValueError for an unknown name or key, or a setting the line cannot take."""
    name, settings = parse_line(spec)
    base = base_variant(name)
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
    number = {key: int(settings[key]) for key in ("q_cold", "prefill_batch") if key in settings}
    return replace(
        base,
        label=label,
        eviction=settings.get("eviction", base.eviction),
        q_cold=number.get("q_cold"),
        qas=qas,
        prefill_batch=number.get("prefill_batch"),
    )


def make_variants(specs: list[str]) -> tuple[Variant, ...]:
    """The lines of a comparison, one per spec, in order (`line_variant`)."""
    return tuple(line_variant(spec) for spec in specs)
