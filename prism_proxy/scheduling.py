"""The proxy's scheduling objects built from its settings: the admission core (its QAS
policy, prefill pacing, round window, queue bound, cold deadline, fair share) and, when
QAS weighs residency and may ask DART, the resident sets it reads instead of its own
cache view. One assembly for the app (`edge.gateway.assemble`) and the twin
(`loadgen.twin`), as `EngineCore.build` serves prism-sim and the twin.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prism_proxy.admission.core import AdmissionCore, PrefillPacing
from prism_proxy.config import ProxyConfig
from prism_proxy.qas.policies import SchedulingPolicy, make_policy
from prism_proxy.qas.prism import PrismPolicy
from prism_proxy.qas.residency import PendingResidency, ResidentSegments, UnionResidency


def admission_core(
    config: ProxyConfig,
    *,
    max_queue: int | None = None,
    account_weight: Callable[[str], float] | None = None,
) -> AdmissionCore:
    """The admission core as `config` sets it (`max_queue`: else `config.max_queue`;
    `account_weight`: each account's fair-share weight, else 1). Pacing's B and
    backstop stay automatic until the engine tells its limits (`learn_backend`)."""
    return AdmissionCore(
        make_policy(config.policy, config.qas),
        PrefillPacing(config.prefill_batch, config.max_inflight, config.replicas),
        window_s=config.window_s,
        max_queue=config.max_queue if max_queue is None else max_queue,
        cold_deadline_s=config.qas.cold_deadline_s,
        share_accounts=config.fair_share,
        account_weight=account_weight,
    )


def dart_resident_sets(
    policy: SchedulingPolicy,
    config: ProxyConfig,
    sources: int,
    clock: Callable[[], float] = time.monotonic,
) -> list[ResidentSegments]:
    """When prism weighs residency and may ask DART (`residency` auto or dart, with
    `sources` DARTs to read: one per control RPC), it reads DART's resident sets (their
    union, with several replicas) instead of its own cache view, plus what it released
    that DART has not reported yet (`PendingResidency`): one set per source, for the
    caller to keep up to date; none (the policy left as it is) otherwise."""
    if not isinstance(policy, PrismPolicy) or config.qas.w_c <= 0:
        return []
    if sources <= 0 or config.residency == "view":
        return []
    sets = [ResidentSegments() for _ in range(sources)]
    source = sets[0] if len(sets) == 1 else UnionResidency(sets)
    policy.residency = PendingResidency(source, clock=clock)
    return sets
