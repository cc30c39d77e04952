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
* Ablations of `prism`: another eviction order (`prism[lru]`), cold-lane quota
  (`prism[q_cold=4]`), a QAS variant (`prism[qas=paper]`), and any proxy
  policy at a fixed prefill batch `B` (`fifo[B=16]`). Plain `prism` runs the sweep's
  QAS variant (`--qas`, by default the proxy's default).
"""

from __future__ import annotations

from dataclasses import dataclass

from prism_proxy.qas.params import QAS_VARIANTS

PROXY_BASELINES = ("fifo", "klpm", "contextpilot-style")
NATIVE = ("sglang-fcfs", "sglang-lpm", "sglang-hrrn")
PEER_LINES = ("contextpilot-real", "contextpilot-rag")  # loadgen.stack.peer_lines.PEER_SERVERS
BASELINES = (*PROXY_BASELINES, *NATIVE, *PEER_LINES)
POLICIES = (*PROXY_BASELINES, "prism")
ALL_POLICIES = (*POLICIES, *NATIVE)  # the default lines
KNOWN_LINES = (*ALL_POLICIES, *PEER_LINES)


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


def make_variants(
    policies: list[str],
    evictions: list[str],
    q_colds: list[int],
    prefill_batch: list[int] | None = None,
    qas_variants: list[str] | None = None,
) -> tuple[Variant, ...]:
    """The named policies, then PRISM's eviction, q_cold and QAS-variant ablations, then
    every proxy policy of the list at each fixed `B`."""
    variants = [base_variant(name) for name in policies]
    for eviction in evictions:
        if eviction != "dart" or "prism" not in policies:
            variants.append(Variant(f"prism[{eviction}]", "prism", eviction))
    for q_cold in q_colds:
        variants.append(Variant(f"prism[q_cold={q_cold}]", "prism", "dart", q_cold))
    for qas in qas_variants or []:
        if qas not in QAS_VARIANTS:
            raise ValueError(f"unknown QAS variant {qas!r}; choose from {', '.join(QAS_VARIANTS)}")
        variants.append(Variant(f"prism[qas={qas}]", "prism", "dart", qas=qas))
    for batch in prefill_batch or []:
        for base in [v for v in variants[: len(policies)] if v.policy is not None]:
            label = f"{base.label}[B={batch}]"
            variants.append(Variant(label, base.policy, base.eviction, prefill_batch=batch))
    return tuple(variants)
