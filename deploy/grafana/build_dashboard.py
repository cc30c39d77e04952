"""Build the PRISM Grafana dashboard, `deploy/grafana/dashboards/prism.json`.

    python deploy/grafana/build_dashboard.py            # rewrite the JSON
    python deploy/grafana/build_dashboard.py --check    # exit 1 if the JSON is stale

The panels are declared below as (title, unit, [(legend, PromQL)]); the JSON is generated
so that every query stays in one readable table. `tests/test_deploy_dashboard.py` checks
that the committed JSON matches this file; `tests/test_deploy_stack.py` that every metric
these queries name is exported by the proxy, the simulated engine or the DART control RPC.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
OUTPUT = Path(__file__).resolve().parent / "dashboards" / "prism.json"
RATE = "$__rate_interval"


def quantile(q: float, family: str, by: str = "le") -> str:
    """`histogram_quantile` over a histogram family's `_bucket` series."""
    return f"histogram_quantile({q}, sum by ({by}) (rate({family}_bucket[{RATE}])))"


def ratio(numerator: str, denominator: str, by: str = "") -> str:
    """`sum(rate(a)) / sum(rate(b))`, optionally grouped."""
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({numerator}[{RATE}])) / sum{group} (rate({denominator}[{RATE}]))"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[tuple[str, str], ...]  # (legend, PromQL)
    description: str = ""
    kind: str = "timeseries"  # or "stat"
    stacked: bool = False
    width: int = 12


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Latency (proxy view)",
        (
            Panel(
                "Time to first token",
                "s",
                (
                    ("P50", quantile(0.5, "prism:ttft_seconds")),
                    ("P99", quantile(0.99, "prism:ttft_seconds")),
                    ("P99 {{lane}}", quantile(0.99, "prism:ttft_seconds", "le, lane")),
                ),
                "Arrival at the proxy to the first streamed token, all lanes and per lane.",
            ),
            Panel(
                "Admission wait (QAS)",
                "s",
                (
                    ("P50", quantile(0.5, "prism:admission_wait_seconds")),
                    ("P99", quantile(0.99, "prism:admission_wait_seconds")),
                    ("P99 {{lane}}", quantile(0.99, "prism:admission_wait_seconds", "le, lane")),
                ),
                "Arrival to release by QAS (SPEC §2): the share of TTFT spent queued.",
            ),
            Panel(
                "End-to-end latency",
                "s",
                (
                    ("P50", quantile(0.5, "prism:e2e_latency_seconds")),
                    ("P99", quantile(0.99, "prism:e2e_latency_seconds")),
                ),
            ),
            Panel(
                "Engine TTFT (SGLang view)",
                "s",
                (
                    ("P50", quantile(0.5, "sglang:time_to_first_token_seconds")),
                    ("P99", quantile(0.99, "sglang:time_to_first_token_seconds")),
                ),
                "TTFT as the engine measures it, from its own arrival (no admission wait).",
            ),
        ),
    ),
    (
        "Prefix-cache hit rate",
        (
            Panel(
                "Hit rate: proxy vs SGLang",
                "percentunit",
                (
                    ("proxy", ratio("prism:cached_tokens_total", "prism:prompt_tokens_total")),
                    ("SGLang", ratio("sglang:cached_tokens_total", "sglang:prompt_tokens_total")),
                ),
                "Cached / prompt tokens. Proxy: from each answer's meta_info (requests through"
                " the proxy). SGLang: the engine's counters (all requests it served).",
            ),
            Panel(
                "Hit rate by lane",
                "percentunit",
                (
                    (
                        "{{lane}}",
                        ratio("prism:cached_tokens_total", "prism:prompt_tokens_total", "lane"),
                    ),
                ),
            ),
            Panel(
                "Hit rate over the dashboard range",
                "percentunit",
                (
                    (
                        "proxy",
                        "sum(increase(prism:cached_tokens_total[$__range]))"
                        " / sum(increase(prism:prompt_tokens_total[$__range]))",
                    ),
                    (
                        "SGLang",
                        "sum(increase(sglang:cached_tokens_total[$__range]))"
                        " / sum(increase(sglang:prompt_tokens_total[$__range]))",
                    ),
                ),
                "Run-level exact-prefix hit rate, the paper's metric.",
                kind="stat",
                width=6,
            ),
            Panel(
                "KV cache usage",
                "percentunit",
                (("used", "max(sglang:token_usage)"),),
                width=6,
            ),
        ),
    ),
    (
        "Replicas (scale-out profile, docs/scale-out.md)",
        (
            Panel(
                "Requests by replica",
                "reqps",
                (("{{instance}}", f"sum by (instance) (rate(prism:requests_total[{RATE}]))"),),
                "Requests each PRISM replica's proxy answered: the gateway's balance.",
            ),
            Panel(
                "QAS queue by replica",
                "short",
                (("{{instance}}", "sum by (instance) (prism:queue_depth)"),),
                "Requests waiting in each replica's QAS (what /v1/loads reports to the gateway).",
            ),
        ),
    ),
    (
        "Load, waves and lanes",
        (
            Panel(
                "Queue depth and in-flight",
                "short",
                (
                    ("QAS queue", "sum(prism:queue_depth)"),
                    ("proxy in-flight", "sum(prism:inflight_requests)"),
                    ("engine running", "sum(sglang:num_running_reqs)"),
                    ("engine waiting", "sum(sglang:num_queue_reqs)"),
                ),
            ),
            Panel(
                "Prefill pacing",
                "short",
                (
                    ("pending prefill", "sum(prism:pending_prefill_requests)"),
                    ("B (limit)", "max(prism:prefill_batch)"),
                    ("backstop", "max(prism:inflight_limit)"),
                ),
                "Released requests still waiting for their first token against B (SPEC §2"
                " prefill pacing): a round releases only while pending < B.",
            ),
            Panel(
                "Releases by lane (requests/s)",
                "reqps",
                (("{{lane}}", f"sum by (lane) (rate(prism:releases_total[{RATE}]))"),),
                "Requests QAS released per lane: hot (bucketed), cold (oldest first).",
                stacked=True,
            ),
            Panel(
                "Lane mix (requests/s)",
                "reqps",
                (("{{lane}}", f"sum by (lane) (rate(prism:requests_total[{RATE}]))"),),
                "Finished requests per lane: hot (bucketed by QAS), cold, passthrough.",
                stacked=True,
            ),
            Panel(
                "Waves",
                "short",
                (
                    ("waves/s", f"sum(rate(prism:wave_size_count[{RATE}]))"),
                    ("mean wave size", ratio("prism:wave_size_sum", "prism:wave_size_count")),
                    ("P99 wave size", quantile(0.99, "prism:wave_size")),
                ),
            ),
            Panel(
                "Requests by status",
                "reqps",
                (("{{status}}", f"sum by (status) (rate(prism:requests_total[{RATE}]))"),),
                stacked=True,
            ),
            Panel(
                "QAS round time",
                "s",
                (
                    ("P50", quantile(0.5, "prism:qas_round_seconds")),
                    ("P99", quantile(0.99, "prism:qas_round_seconds")),
                ),
                "CPU time of one plan_round (O(S), SPEC §2).",
            ),
        ),
    ),
    (
        "Accounts (API keys; without keys every client is one account, addr)",
        (
            Panel(
                "Requests by account and status",
                "reqps",
                (
                    (
                        "{{account}} {{status}}",
                        f"sum by (account, status) (rate(prism:account_requests_total[{RATE}]))",
                    ),
                ),
                "Finished requests of the generating endpoints (docs/keys.md, metrics per"
                " account); (unauthenticated) is the 401s.",
                stacked=True,
            ),
            Panel(
                "429s by account and limit",
                "reqps",
                (
                    (
                        "{{account}} {{limit}}",
                        "sum by (account, limit) (rate(prism:account_requests_total"
                        f'{{status="429"}}[{RATE}]))',
                    ),
                ),
                "Which limit refused them: max_inflight, tokens_per_minute, max_queued"
                " (the key's), max_queue (the proxy's), max_client_decode_tokens, grammars.",
                stacked=True,
            ),
            Panel(
                "Tokens by account (tokens/s)",
                "short",
                (
                    (
                        "{{account}} {{kind}}",
                        f"sum by (account, kind) (rate(prism:account_tokens_total[{RATE}]))",
                    ),
                ),
                "Prompt and completion tokens of the answers, as the engine reported them.",
            ),
            Panel(
                "In flight and queued by account",
                "short",
                (
                    ("{{account}} in flight", "sum by (account) (prism:account_inflight_requests)"),
                    ("{{account}} queued", "sum by (account) (prism:account_queued_requests)"),
                ),
                "In flight: from headers to answer (queued included); queued: waiting in QAS.",
            ),
        ),
    ),
    (
        "Control RPC and DART",
        (
            Panel(
                "Control RPC health",
                "short",
                (
                    ("control RPC up", "min(prism:control_rpc_up)"),
                    ("backend up", "min(prism:backend_up)"),
                    ("pushes/s", f"sum(rate(prism:control_rpc_pushes_total[{RATE}]))"),
                    ("failures/s", f"sum(rate(prism:control_rpc_failures_total[{RATE}]))"),
                ),
                "Up = 1 when the last push / backend exchange succeeded. While the RPC is"
                " down the proxy keeps serving and DART orders like LRU (SPEC §4).",
            ),
            Panel(
                "DART evictions by class (tokens/s)",
                "short",
                (
                    (
                        "{{class}}",
                        f"sum by (class) (rate(prism:dart_evicted_tokens_total[{RATE}]))",
                    ),
                    ("engine total", f"sum(rate(sglang:evicted_tokens_total[{RATE}]))"),
                ),
                "SPEC §3 eviction order: private suffixes, then unprotected segments by"
                " priority, then protected anchors.",
                stacked=False,
            ),
            Panel(
                "DART protection",
                "short",
                (
                    ("protected tokens", "sum(prism:dart_protected_tokens)"),
                    ("anchors resident", "sum(prism:dart_anchors_resident)"),
                    ("segments resident", "sum(prism:dart_segments_resident)"),
                ),
            ),
            Panel(
                "DART priority tables applied",
                "short",
                (("epoch changes", f"sum(changes(prism:dart_priority_epoch[{RATE}]))"),),
                "Priority-table epochs the plugin accepted in the interval.",
            ),
        ),
    ),
)


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = [
        {
            "datasource": DATASOURCE,
            "expr": expr,
            "legendFormat": legend,
            "refId": chr(ord("A") + i),
            "range": panel.kind == "timeseries",
            "instant": panel.kind == "stat",
        }
        for i, (legend, expr) in enumerate(panel.targets)
    ]
    custom: dict[str, Any] = {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
    if panel.stacked:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                **({"custom": custom} if panel.kind == "timeseries" else {}),
            },
            "overrides": [],
        },
        "options": (
            {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
            if panel.kind == "timeseries"
            else {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
        ),
        "targets": targets,
    }


def build_dashboard() -> dict[str, Any]:
    """The dashboard as a JSON-ready dict (Grafana 11 schema)."""
    panels: list[dict[str, Any]] = []
    panel_id, y = 1, 0
    for row_title, row_panels in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id, y = panel_id + 1, y + 1
        x = 0
        for panel in row_panels:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(_panel_json(panel, panel_id, x, y))
            panel_id, x = panel_id + 1, x + panel.width
        y += 8
    return {
        "uid": "prism-overview",
        "title": "PRISM",
        "description": "PRISM admission proxy (QAS) and DART retention next to SGLang",
        "tags": ["prism", "sglang"],
        "timezone": "browser",
        "editable": False,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "5s",
        "time": {"from": "now-15m", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard's panels."""
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


_PROMQL_WORDS = frozenset(
    [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
        "inf",
        "nan",
    ]
)
_IDENTIFIER = re.compile(r"(?<![\w.:$])[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (e.g. `prism:ttft_seconds_bucket`).

    Drops string literals, label matchers `{…}`, range/subquery brackets `[…]`, grouping
    label lists (`by (…)`, `on (…)`, …), Grafana variables (`$__range`), function names
    (an identifier followed by `(`), keywords and numbers.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in _PROMQL_WORDS:
            continue
        names.add(match.group())
    return names


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON is stale")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render(build_dashboard())
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
