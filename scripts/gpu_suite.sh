#!/usr/bin/env bash
# Every GPU test and benchmark of the project, for one `device` run, as a declared list of
# suites (docs/GPU_TESTS.md, docs/BENCHMARKS.md):
#   bash scripts/gpu_suite.sh SUITE...     (carry [".whl", ".jitcache"])
#   bash scripts/gpu_suite.sh list         the suites and their settings
# Logs go under $OUT (default ./gpu-out). JIT caches (FlashInfer, Triton) are restored from
# .jitcache/ when present and saved to $OUT/jit-*. An experiment on one engine setting is no
# suite of its own: `evidence` runs an ABBA comparison of any setting, `step` and `loop` take
# the benchmarks' options (STEP_ARGS, LOOP_ARGS), `tests` takes a -k expression (TESTS_K).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"

# name | what it runs | its settings (environment variables)
SUITES=(
  "tests|every GPU test in one process, durations and a JSON line per test|TESTS_TIER=full/quick TESTS_ORDER=file/reverse/shuffle:SEED TESTS_K=expr TESTS_TIMEOUT=580 TESTS_POISON=1 (--gpu-poison)"
  "quick|the quick tier of the GPU tests (run on every engine change)|as tests"
  "step|0.8b decode steps at batch 64 and 128, eager and graphs, profiled; prefill and mixed steps|STEP_ARGS=extra bench_gpu_step options, e.g. --pdl or --state-dtype bfloat16"
  "budget|the decode step's per-kernel time budget at batch 64 and 128, then Orpheus 3b's step and codec step (docs/KERNELS.md)|BUDGET_BATCHES=\"64 128\" BUDGET_ORPHEUS=64 (0: none)"
  "loop|the served decode iteration apart (bench_decode_loop), strict and overlapped, profiled|LOOP_ARGS=extra options, e.g. --closed or --pdl"
  "kernels|each kernel benchmark: Gated DeltaNet, decode attention, our GEMM, the launch cost|-"
  "accuracy|engine.state_dtype bfloat16 (or --state-dtype float16) against float32: greedy agreement at 0.8b, and with --versus engine.KEY=V a kernel change's|ACCURACY_ARGS ACCURACY_TIMEOUT=400"
  "figures|one fresh server per load: the figures table and the iteration's phases|FIGURES_SCENARIO=qwen35 FIGURES_C=\"64 128\" FIGURES_SET=engine.k=v,..."
  "run|one bench run --abba|RUN_C=64 RUN_ARGS=arms and load (default graphs off vs on)"
  "verdicts|planted ~3% GPU delay must exit 1, an A/A exit 0 (2 blocks at c=64)|VERDICTS=\"planted aa\" VERDICT_SET VERDICT_DELAY_US=70 VERDICT_LOAD"
  "evidence|ABBA comparisons of engine settings, 3 blocks each, one tarball each|EVIDENCE=\"name:engine.key[+engine.key2][:A:B] ...\" EVIDENCE_SCENARIO EVIDENCE_C EVIDENCE_LOAD EVIDENCE_BUDGET=300 EVIDENCE_UNTIL=300 EVIDENCE_CONTINUE=DIR"
  "orpheus|Orpheus 3b audio-s/s at c=32 and c=64, and its iteration profiled|-"
  "scrape|does a 1 s /metrics scrape loop move output tok/s? an A/A (bench_scrape_cost)|SCRAPE_ARGS=\"-c 64 --blocks 2\""
  "probe|decode graph against the eager step per engine in one process, memory poisoned (probe_graph_order)|PROBE_ORDER=\"--poison triton flashinfer triton\""
  "race|staggered prefill-stream runs: the same steps, the same tokens? beside, then serial (probe_prefill_stream)|RACE_RUNS=6 RACE_ARGS=--piecewise-gdn"
)
[ "${1:-list}" = list ] && { printf '%s\n' "${SUITES[@]}" | column -t -s '|'; exit 0; }
names=$(printf '%s\n' "${SUITES[@]}" | cut -d'|' -f1)
requested=("$@")
[ "${requested[*]}" = all ] && requested=(tests step budget run)  # every test, then the figures
for suite in "${requested[@]}"; do  # every name checked before the machine's minutes are spent
  grep -qx -- "$suite" <<< "$names" || { echo "no suite $suite; one of: all $(tr '\n' ' ' <<< "$names")"; exit 2; }
done

export PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fi TRITON_CACHE_DIR=/tmp/triton-cache
# FlashInfer's JIT .so files restored below load as they are (flashinfer_import.py): without
# it, ninja, lacking the objects, recompiles them (minutes of each fresh machine)
export BENCH_FLASHINFER_PREBUILT=1
if [ -d .whl ] && [ ! -d /tmp/site/flashinfer ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
fi
export PYTHONPATH=$PWD:/tmp/site
mkdir -p /tmp/fi /tmp/triton-cache
if ls .jitcache/jit-* >/dev/null 2>&1 && [ ! -e /tmp/fi/.restored ]; then
  cat .jitcache/jit-* | tar -x -z -C / && touch /tmp/fi/.restored && echo "JIT cache restored"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv > "$OUT/gpu.txt"

results() { grep -E "PASSED|FAILED|ERROR|passed|failed|decode step|step,|GPU busy|Error|error" ; }

failures() {  # a run's failed requests, their errors counted, and its servers' log errors
  [ -f "$1/requests.parquet" ] || { echo "no requests recorded in $1"; return 0; }
  python3 - "$1" <<'PY'
import sys, pandas as pd
r = pd.read_parquet(sys.argv[1] + "/requests.parquet")
bad = r[(r.status != 200) | r.error.notna()]
if len(bad):  # "interrupted": cut in flight by a stop or a guard, not a server's failure
    print(f"{len(bad)} not completed of {len(r)}; status, error:")
    print(bad.groupby([bad.status, bad.error.fillna("-").str[:160]]).size().to_string())
PY
  grep -hiE -m 20 -B 2 "error|traceback|exception" "$1"/logs/*.log 2>/dev/null | tail -n 40
}

suite_tests() {  # $1: full | quick
  local mark=gpu log="$OUT/gpu_tests_$1.log"
  [ "$1" = quick ] && mark="gpu and gpu_quick"
  timeout "${TESTS_TIMEOUT:-580}" python3 -m pytest -m "$mark" -v -rA --durations=0 \
    --order "${TESTS_ORDER:-file}" --gpu-log "$OUT/gpu_tests_$1.jsonl" ${TESTS_POISON:+--gpu-poison} \
    ${TESTS_K:+-k "$TESTS_K"} tests/test_gpu_double_buffer.py tests/test_gpu_kernels.py \
    tests/test_bench_gpu_step.py tests/test_gpu.py > "$log" 2>&1
  echo "pytest exit $? (124: cut by its timeout)" | tee -a "$log"
  grep -E "PASSED|FAILED|ERROR|passed|failed|left changed" "$log" | tail -n 80
}

suite_step() {
  local b g mode
  for b in 64 128; do
    for g in no-graphs graphs; do
      timeout 150 python3 -m benchmarks.bench_gpu_step --batch $b --context 512 --kernels cuda \
        --$g --no-piecewise --profile "$OUT/profile_b${b}_$g.txt" ${STEP_ARGS:-} 2>&1 \
        | results | tee -a "$OUT/bench_step.log"
    done
  done
  for mode in "--no-piecewise" "--piecewise" "--piecewise --mixing"; do
    timeout 150 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 20 \
      --graphs $mode --prefill 1x384 4x256 ${STEP_ARGS:-} 2>&1 | results \
      | tee -a "$OUT/bench_step.log"
  done
}

suite_budget() {
  local b
  for b in ${BUDGET_BATCHES:-64 128}; do
    timeout 200 python3 -m benchmarks.bench_step_budget --batch "$b" --context 512 \
      --markdown "$OUT/budget_b$b.md" --json "$OUT/budget_b$b.json" 2>&1 | tail -n 40 \
      | tee -a "$OUT/budget.log"
  done
  b=${BUDGET_ORPHEUS:-64}
  [ "$b" = 0 ] && return
  timeout 300 python3 -m benchmarks.bench_step_budget --scenario orpheus --batch "$b" \
    --context 256 --codec-windows "$b" --markdown "$OUT/budget_orpheus_b$b.md" \
    --json "$OUT/budget_orpheus_b$b.json" 2>&1 | tail -n 40 | tee -a "$OUT/budget.log"
}

suite_loop() {
  local pdl
  for pdl in no-pdl pdl; do
    timeout 200 python3 -m benchmarks.bench_decode_loop --size 0.8b --loop both --$pdl \
      --profile "$OUT/loop_$pdl.txt" ${LOOP_ARGS:-} 2>&1 | grep -v "^USDT" \
      | tee -a "$OUT/bench_loop.log"
  done
}

suite_kernels() {
  timeout 150 python3 -m benchmarks.bench_gdn_kernels --paths --state-dtypes float32 \
    --recurrent --json "$OUT/gdn.jsonl" 2>&1 | tee "$OUT/gdn_kernels.log"
  timeout 120 python3 -m benchmarks.bench_decode_attention --json "$OUT/decode_attn.jsonl" \
    2>&1 | tee "$OUT/decode_attn.log"
  timeout 120 python3 -m benchmarks.bench_gemm --json "$OUT/gemm.jsonl" 2>&1 \
    | tee "$OUT/gemm.log"
  timeout 60 python3 -m benchmarks.bench_launch 2>&1 | tee "$OUT/bench_launch.log"
}

suite_accuracy() {
  timeout "${ACCURACY_TIMEOUT:-400}" python3 -m benchmarks.bench_state_accuracy --size 0.8b \
    ${ACCURACY_ARGS:---requests 16 --prompt 128 --tokens 512} 2>&1 | tail -n 30 \
    | tee "$OUT/state_accuracy.log"
}

suite_figures() {  # bench measure takes a scenario file: FIGURES_SET goes into a copy of it
  local scenario=${FIGURES_SCENARIO:-qwen35} c run
  if [ -n "${FIGURES_SET:-}" ]; then
    python3 - "$scenario" "$FIGURES_SET" <<'PY' || exit 3
import sys, yaml
from engine.config.files import scenario_path
from harness.scenario import parse_overrides
raw = yaml.safe_load(scenario_path(sys.argv[1]).read_text())
size = raw["sizes"].setdefault(raw["default_size"]["cuda"], {})
for key, value in parse_overrides(sys.argv[2]).items():
    section, name = key.split(".", 1)
    size.setdefault(section, {})[name] = value
open("/tmp/figures-set.yaml", "w").write(yaml.safe_dump(raw, sort_keys=False))
PY
    scenario=/tmp/figures-set.yaml
  fi
  for c in ${FIGURES_C:-64 128}; do
    echo "== $scenario c=$c ${FIGURES_SET:-}" | tee -a "$OUT/figures.log"
    run="/tmp/figures-c$c-$RANDOM"  # a first server may compile what the JIT cache lacks
    timeout 300 python3 -m harness measure "$scenario" -c "$c" \
      --requests $((4 * c)) --warmup "$c" --out "$run" > "$run.log" 2>&1
    { head -n 24 "$run.log"; grep -E "^doubt|^interrupted" "$run.log"
      grep -h "warmup:" "$run"/logs/*.log 2>/dev/null | cut -c 12-170
      failures "$run"; } | tee -a "$OUT/figures.log"
  done
}

suite_run() {
  timeout 560 python3 -m harness run qwen35 -c "${RUN_C:-64}" --abba \
    ${RUN_ARGS:---requests 320 --warmup 64 --arm eager=engine.cuda_graphs=false --arm graphs=engine.cuda_graphs=true} \
    --out /tmp/run 2>&1 | tee "$OUT/bench_run.log"
  cp /tmp/run/summary.json "$OUT/run_summary.json" 2>/dev/null
}

suite_verdicts() {  # arm B: a spin kernel after each decode-lane step (engine.planted_gpu_delay_us)
  local which set_a set_b a b
  for which in ${VERDICTS:-planted aa}; do
    set_a=${VERDICT_SET:-} set_b=${VERDICT_SET:+$VERDICT_SET,}
    a="base=${set_a:-worktree}" b="slow=${set_b}engine.planted_gpu_delay_us=${VERDICT_DELAY_US:-70}"
    [ "$which" = aa ] && b="b=${set_a:-worktree}"
    rm -rf "/tmp/verdict-$which"
    timeout 560 python3 -m harness run qwen35 -c 64 --abba --blocks 2 --report \
      ${VERDICT_LOAD:---requests 320 --warmup 64} --arm "$a" --arm "$b" \
      --out "/tmp/verdict-$which" > "$OUT/verdict-$which.log" 2>&1
    echo "exit $?" | tee -a "$OUT/verdict-$which.log"
    grep -E "headline|output tok/s|doubt" "$OUT/verdict-$which.log" | head -n 12
    tar -C /tmp -c -z -f "$OUT/verdict-$which.tgz" --exclude='*.parquet' "verdict-$which"
  done
}

suite_evidence() {  # key=A ("off", default false) against key=B ("on", default true); the
  # load keeps whole requests in each server's steady window (320 = 5 a client at c=64)
  local began=$SECONDS spec name key a b keys off on more keep
  for spec in ${EVIDENCE:-graphs:engine.cuda_graphs}; do
    IFS=: read -r name key a b <<< "$spec"; a=${a:-false}; b=${b:-true}
    IFS=+ read -r -a keys <<< "$key"  # engine.k1+engine.k2: both settings in each arm
    off=$(printf "%s=$a," "${keys[@]}") on=$(printf "%s=$b," "${keys[@]}")
    if (( SECONDS - began > ${EVIDENCE_UNTIL:-300} )); then echo "skipped $name"; continue; fi
    echo "== $name ($key) at $((SECONDS - began)) s"
    rm -rf "/tmp/ev-$name" "/tmp/ev-$name.log"  # a run directory must be new or empty
    more=() keep=(--exclude='*.parquet')
    if [ -n "${EVIDENCE_CONTINUE:-}" ]; then  # a carried folder of earlier calls' tarballs
      keep=()
      if [ -f "$EVIDENCE_CONTINUE/ev-$name.tgz" ]; then
        tar -x -z -C /tmp -f "$EVIDENCE_CONTINUE/ev-$name.tgz" && more=(--continue)
      fi
    fi
    # --time-budget ends the schedule between whole blocks; the timeout only guards a hang
    timeout $(( ${EVIDENCE_BUDGET:-300} + 150 )) python3 -m harness run \
      "${EVIDENCE_SCENARIO:-qwen35}" -c "${EVIDENCE_C:-64}" --abba --blocks 3 \
      --time-budget "${EVIDENCE_BUDGET:-300}" --report ${EVIDENCE_LOAD:---requests 320 --warmup 64} \
      --out "/tmp/ev-$name" "${more[@]}" --arm "off=${off%,}" --arm "on=${on%,}" \
      > "/tmp/ev-$name.log" 2>&1
    echo "exit $? after $((SECONDS - began)) s" | tee -a "/tmp/ev-$name.log"
    python3 scripts/run_counts.py "/tmp/ev-$name" >> "/tmp/ev-$name.log" 2>&1
    head -n 30 "/tmp/ev-$name.log"
    mkdir -p "/tmp/ev-$name" && cat "/tmp/ev-$name.log" >> "/tmp/ev-$name/bench_run.log"
    tar -C /tmp -c -z -f "$OUT/ev-$name.tgz" "${keep[@]}" "ev-$name"
  done
}

suite_orpheus() {
  local c
  for c in 32 64; do
    timeout 280 python3 -m harness run orpheus -c $c --abba --requests $((2 * c)) \
      --warmup 16 --out "/tmp/orpheus-c$c" 2>&1 | head -n 40 | tee -a "$OUT/orpheus.log"
  done
  timeout 250 python3 -m benchmarks.bench_orpheus_iteration --size 3b --requests 64 \
    --profile "$OUT/orpheus_iteration_profile.txt" 2>&1 | grep -v "^USDT" | tail -n 80 \
    | tee -a "$OUT/orpheus.log"
}

suite_scrape() {
  timeout 560 python3 -m benchmarks.bench_scrape_cost --size 0.8b ${SCRAPE_ARGS:--c 64 --blocks 2} \
    --set engine.stall_timeout_s=120 2>&1 | tail -n 40 | tee "$OUT/scrape_cost.log"
}

suite_probe() {
  timeout 300 python3 -m benchmarks.probe_graph_order ${PROBE_ORDER:---poison triton flashinfer triton} \
    2>&1 | grep -v "^USDT" | tail -n 60 | tee "$OUT/probe_graph_order.log"
}

suite_race() {
  local mode
  for mode in "" --serial; do
    timeout 280 python3 -m benchmarks.probe_prefill_stream --runs "${RACE_RUNS:-6}" $mode \
      ${RACE_ARGS:-} 2>&1 | grep -v "^USDT" | tail -n 30 | tee -a "$OUT/probe_prefill_stream.log"
  done
}

for suite in "${requested[@]}"; do
  case $suite in
    tests) suite_tests "${TESTS_TIER:-full}" ;;
    quick) suite_tests quick ;;
    *) "suite_$suite" ;;
  esac
done
# At most 8 files come back from $OUT: past 6, the logs go into one logs.tgz (the JIT
# caches and the evidence tarballs stay apart).
shopt -s nullglob
logs=()
for f in "$OUT"/*; do case ${f##*/} in jit-*|*.tgz) ;; *) logs+=("${f##*/}") ;; esac; done
if (( ${#logs[@]} > 6 )); then tar -C "$OUT" -c -z -f "$OUT/logs.tgz" "${logs[@]}" \
  && (cd "$OUT" && rm -f "${logs[@]}"); fi
# The JIT caches (FlashInfer's .so files; Triton's cubins, PTX and metadata, not the IRs a
# cache hit never reads) for the next machine: a call carries 64 MiB in all
tar -c -z -f /tmp/jit.tgz --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' \
  /tmp/fi/.cache/flashinfer/*/*/cached_ops/*/*.so /tmp/triton-cache \
  2>/dev/null && split -b 15M /tmp/jit.tgz "$OUT/jit-" && ls -la "$OUT"
