"""A line in the twin: its `TwinSetup` and its `SessionFeatures`, from the one `Line`
(`loadgen.stack.lines`) that the real stack's settings come from too."""

from __future__ import annotations

from typing import Any

from loadgen.stack.lines import KNOWN_RETURNS, Line, Pairs, line_qas
from loadgen.twin.session_twin import SessionFeatures
from loadgen.twin.twin import TwinSetup
from prism_proxy.admission.sessions import SessionParams as TableParams


def twin_setup(
    line: Line, *, qas: str | None = None, qas_overrides: Pairs = (), **run: Any
) -> TwinSetup:
    """The twin's setup of `line`: its policy, engine and QAS (`line_qas` with the
    experiment's `qas` and `qas_overrides`), and `run`, the experiment's own settings
    (`kv_capacity_tokens`, `profile`, `window_s`, `seed`, `layout`, ...). The host tier's
    ratio and bandwidth the line leaves unset stay `TwinSetup`'s defaults."""
    host = {
        "hicache_ratio": line.hicache_ratio,
        "hicache_bandwidth_gbps": line.hicache_bandwidth_gbps,
    }
    return TwinSetup(
        policy=line.policy,
        eviction=line.eviction,
        eviction_config=dict(line.eviction_config) or None,
        schedule_policy=line.schedule_policy,
        qas=line_qas(line, qas, qas_overrides),
        prefill_batch=line.prefill_batch,
        hicache=line.hicache,
        **{key: value for key, value in host.items() if value is not None},
        **run,
    )


def session_features(line: Line) -> SessionFeatures | None:
    """The proxy's session features on `line` in the twin (None: the line sets none);
    the session table's rank and retention start where the line names them (the
    `KNOWN_RETURNS` rank: the table ranks and times by its return model, which knows)."""
    if line.detect is None and line.retain is None:
        return None
    known = line.session_rank == KNOWN_RETURNS
    rank = "predicted" if known else line.session_rank
    table = {"rank": rank, "retain_from": line.session_retain_from}
    table |= dict(line.session_overrides)
    return SessionFeatures(
        detect=bool(line.detect),
        retain=bool(line.retain),
        params=TableParams(**{key: value for key, value in table.items() if value is not None}),
        known_returns=known,
    )
