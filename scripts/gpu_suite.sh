#!/usr/bin/env bash
# Every GPU test and benchmark of the project, for one `device` run (see docs/BENCHMARKS.md):
#   bash scripts/gpu_suite.sh STAGE...  STAGE: tests | models | quick | step | prefill | options |
#   mixed | splitstep | splittune | stacks | accuracy | gdn | gdncap | gdnbench | run | evidence |
#   orpheus | orpheus_step | orpheus_iter | masked | statesteps | figures | decode_attn |
#   decode_attn_3b | decode_tests | codec | codec_folded | codec_next | codec_overlap |
#   codec_kernels | gemm | launch | kept | recurrent | pdl_tests | pdl | loop | pipelined | closed |
#   split | overlap | pstream | verdicts |
#   all
# with carry [".whl", ".jitcache"]. Logs go under $OUT (default ./gpu-out). JIT caches
# (FlashInfer, Triton) are restored from .jitcache/ when present and saved to $OUT/jit-*.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fi TRITON_CACHE_DIR=/tmp/triton-cache
# FlashInfer's JIT .so files restored below load as they are (without it, ninja, lacking
# the objects, recompiled them: ~3 minutes of each fresh machine; flashinfer_import.py)
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
failures() {  # a run's failed requests: their errors counted, and its servers' log errors
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
closed_loop() {  # stage `closed`'s runs: bench_decode_loop --closed on each of "${runs[@]}";
  # CLOSED_PROFILE=all profiles every run (closed_profile_N.txt), else the defaults' alone
  local n=0 opts prof
  for opts in "${runs[@]}"; do
    n=$((n + 1)) prof=()
    if [ -z "$opts" ] || [ "${CLOSED_PROFILE:-}" = all ]; then
      prof=(--profile "$OUT/closed_profile_$n.txt" --profile-iterations 90)
    fi
    timeout 120 python3 -m benchmarks.bench_decode_loop --size 0.8b --closed \
      --iterations 3000 $opts "${prof[@]}" ${CLOSED_ARGS:-} 2>&1 | grep -v "^USDT" \
      | tee -a "$OUT/bench_closed.log" | grep -E "closed loop|iterations:|Error|error"
  done
}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv > "$OUT/gpu.txt"
stages=("$@")
[ "${stages[*]}" = "all" ] && stages=(tests step run)
for stage in "${stages[@]}"; do
  case $stage in
    tests|quick)  # the whole GPU suite in one process, in two tiers (docs/GPU_TESTS.md):
      # `tests` every GPU test (TESTS_TIER=quick: the gpu_quick ones), `quick` that tier;
      # TESTS_ORDER=reverse|shuffle:SEED (the suite passes in any order); TESTS_K="expr": only
      # the tests pytest -k selects. Whole log with durations, and one JSON line per test
      # (seconds, memory, any global setting it left changed) under $OUT
      tier=${TESTS_TIER:-full}; [ "$stage" = quick ] && tier=quick
      mark=gpu; [ "$tier" = quick ] && mark="gpu and gpu_quick"
      timeout "${TESTS_TIMEOUT:-580}" python3 -m pytest -m "$mark" -v -rA --durations=0 \
        --order "${TESTS_ORDER:-file}" --gpu-log "$OUT/gpu_tests_$tier.jsonl" \
        ${TESTS_K:+-k "$TESTS_K"} tests/test_gpu_double_buffer.py tests/test_gpu_kernels.py \
        tests/test_bench_gpu_step.py tests/test_gpu.py > "$OUT/gpu_tests_$tier.log" 2>&1
      echo "pytest exit $? (124: cut by its timeout)" | tee -a "$OUT/gpu_tests_$tier.log"
      grep -E "PASSED|FAILED|ERROR|passed|failed|left changed" "$OUT/gpu_tests_$tier.log" \
        | tail -n 80 ;;
    models)  # the engines alone (tests/test_gpu.py)
      timeout 500 python3 -m pytest -m gpu -v -rA ${TESTS_K:+-k "$TESTS_K"} tests/test_gpu.py \
        2>&1 | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Error" \
        | tee -a "$OUT/gpu_tests.log" ;;
    step)  # decode steps (eager, graphs) and prefill/mixed steps (eager, piecewise)
      for b in 64 128; do
        for g in no-graphs graphs; do
          timeout 150 python3 -m benchmarks.bench_gpu_step --batch $b --context 512 \
            --kernels cuda --$g --no-piecewise --profile "$OUT/profile_b${b}_$g.txt" 2>&1 \
            | grep -E "decode step|Error|error" | tee -a "$OUT/bench_step.log"
        done
      done
      timeout 120 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 10 \
        --warmup 2 --kernels torch 2>&1 | tail -n 3 | tee -a "$OUT/bench_step.log" ;&
    prefill)
      for mode in "--no-piecewise" "--piecewise" "--piecewise --mixing" \
        "--piecewise --gdn-prefill triton" "--piecewise --mixing --gdn-prefill triton"; do
        timeout 150 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 20 \
          --graphs $mode --prefill 1x384 4x256 --profile "/tmp/profile_${mode//[- ]/}" 2>&1 \
          | grep -E "step,|Error|error" | tee -a "$OUT/bench_step.log"
      done
      for f in /tmp/profile_*; do  # one file back: the prefill tables' heads
        echo "== $f" >> "$OUT/prefill_profiles.txt"; head -n 36 "$f" >> "$OUT/prefill_profiles.txt"
      done; rm -f /tmp/profile_* ;;
    options)  # the settings not yet measured, on the step benchmark: decode steps (tensor-core
      # decode attention, bf16 state slots) and prefill/mixed steps (the split GDN kernel)
      for opts in "" "--decode-tensor-cores" "--state-dtype bfloat16" \
        "--decode-tensor-cores --state-dtype bfloat16"; do
        timeout 100 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --graphs \
          --steps 50 $opts 2>&1 | grep -E "decode step|Error|error" | tee -a "$OUT/bench_step.log"
      done
      for gdn in triton triton_split; do
        for mix in --no-mixing --mixing; do
          timeout 120 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 5 \
            --graphs --piecewise $mix --gdn-prefill $gdn --prefill 1x384 4x256 1x1536 \
            --profile /tmp/profile_$gdn$mix 2>&1 | grep -E "step,|Error|error" \
            | tee -a "$OUT/bench_step.log"
        done
      done
      cat /tmp/profile_triton*.prefill_* > "$OUT/options_profiles.txt" ;;
    mixed)  # mixed steps: the single-token rows on the recurrent kernel, the rest chunked
      # (and gdn_prefill auto); its kernel tests and the piecewise replay test (whose mixed
      # step has 8 decode rows), then prefill and mixed steps on auto
      timeout 220 python3 -m pytest -m gpu -q -rA -s tests/test_gpu_kernels.py tests/test_gpu.py \
        -k "gated_deltanet_prefill_then_decode or 08b_piecewise_replay" 2>&1 | tee "$OUT/gpu_tests.log"
      for mix in --no-mixing --mixing; do
        timeout 90 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 5 \
          --graphs --piecewise $mix --gdn-prefill ${MIXED_GDN:-auto} --prefill 1x384 4x256 1x1536 \
          2>&1 | grep -E "step,|Error|error" | tee -a "$OUT/bench_step.log"
      done ;;
    gdncap)  # engine.piecewise_gdn (Gated DeltaNet captured in the piecewise graphs): the
      # 0.8b piecewise replay test with it off and on, then prefill and mixed steps beside 64
      # decoding rows with it off (gdn_prefill auto) and on, profiled (host and GPU tables)
      # (guards sum to under a call's 600 s: the test ~200 s, each step run ~40-70 s)
      timeout 240 python3 -m pytest -m gpu -q -rA -s tests/test_gpu.py \
        -k "08b_piecewise_replay" 2>&1 | tee "$OUT/gdncap_tests.log"
      for mix in --no-mixing --mixing; do
        for cap in --no-piecewise-gdn --piecewise-gdn; do
          timeout 85 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 5 \
            --graphs --piecewise $mix $cap --prefill 1x384 4x256 1x1536 \
            --profile /tmp/profile_gdncap$mix$cap 2>&1 | grep -E "step,|Error|error" \
            | tee -a "$OUT/bench_step.log"
        done
      done
      cat /tmp/profile_gdncap*.prefill_* > "$OUT/gdncap_profiles.txt" ;;
    splitstep)  # gdn_prefill auto (the one-launch kernel below 512 tokens) against triton_split
      # at the prompt lengths the qwen35 load sends, prefill-only and mixed, beside 64 decoding
      # (each run ~25 s warm; the first on a fresh machine builds and compiles: 150 s guards)
      for gdn in auto triton_split; do
        for mix in --no-mixing --mixing; do
          timeout 150 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 5 \
            --graphs --piecewise $mix --gdn-prefill $gdn --prefill 1x128 1x384 4x256 2>&1 \
            | grep -E "step,|Error|error" | tee -a "$OUT/bench_step.log"
        done
      done ;;
    splittune)  # the split kernel tuned (engine.gdn_split; session 7's sweep of the captured
      # form picked these axes): eager split and captured form against their defaults at the
      # kernel (bench_gdn_kernels), then whole steps, each setting beside 64 decoding rows:
      # auto (today's default), triton_split tuned, piecewise_gdn tuned; then the two 0.8b
      # tests fixed in session 6 and FlashInfer's, in what time is left of the call
      tuned=${SPLIT_EAGER:-states_bv=32,states_warps=2,states_stages=1,outputs_bv=64,scores_in_prepare=true}
      captured=${SPLIT_CAPTURED:-$tuned,fixed_recurrent_rows=16,fixed_states_rows=4,fixed_chunks=16}
      timeout 150 python3 -m benchmarks.bench_gdn_kernels --paths --state-dtypes float32 \
        --sweep-path triton_split --sweep "$tuned" --json "$OUT/gdn_tune_eager.jsonl" 2>&1 \
        | tee "$OUT/gdn_tune.log"
      timeout 150 python3 -m benchmarks.bench_gdn_kernels --paths --state-dtypes float32 \
        --sweep "$captured" "${captured/fixed_states_rows=4/fixed_states_rows=1}" \
        --json "$OUT/gdn_tune_captured.jsonl" 2>&1 | tee -a "$OUT/gdn_tune.log"
      for arm in "--gdn-prefill auto" "--gdn-prefill triton_split --gdn-split $tuned" \
                 "--piecewise-gdn --gdn-split $captured"; do
        timeout 200 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 30 \
          --graphs --piecewise $arm --prefill 1x128 1x384 4x256 1x1536 2>&1 \
          | grep -E "step,|Error|error" | tee -a "$OUT/bench_step.log"
      done
      left=$((570 - SECONDS))
      [ $left -gt 60 ] && timeout $left python3 -m pytest -m gpu -q -rA tests/test_gpu.py \
        tests/test_gpu_kernels.py -k "08b_piecewise or flashinfer" 2>&1 | tail -n 30 \
        | tee "$OUT/gpu_tests.log" ;;
    stacks)  # the host calls by Python line of a decode step (batch 64, graphs), a mixed step
      # (1 x 384 beside 64 decoding) and a prefill step (1 x 384, 64 decoding aside), then
      # the eager decode step's host time by Python function (no graphs: its ~16 ms of host)
      timeout 150 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 5 \
        --graphs --piecewise --mixing --prefill 1x384 --profile /tmp/profile_stacks --stacks \
        2>&1 | grep -E "step,|Error|error" | tee -a "$OUT/bench_step.log"
      timeout 150 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 5 \
        --graphs --piecewise --no-mixing --prefill 1x384 --profile /tmp/profile_stacks_p --stacks \
        2>&1 | grep -E "step,|Error|error" | tee -a "$OUT/bench_step.log"
      # (torch 2.11 here records no Python stacks: session 9's eager table came back without
      # them; cProfile gives the eager step's host time by function instead)
      timeout 120 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 5 \
        --no-graphs --no-piecewise --cprofile "$OUT/host_eager.txt" 2>&1 \
        | grep -E "decode step|Error|error" | tee -a "$OUT/bench_step.log"
      cat /tmp/profile_stacks /tmp/profile_stacks.prefill_1x384 > "$OUT/stacks.txt"
      cat /tmp/profile_stacks_p.prefill_1x384 > "$OUT/stacks_prefill.txt" ;;
    gdnbench)  # Gated DeltaNet's kernels alone, one layer call (benchmarks/bench_gdn_kernels.py,
      # docs/KERNELS.md "Tuning the split kernel"): every path at the default shapes with the
      # per-kernel split; the captured form at bench_gpu_step's max_rows (68) beside the
      # engine's (256: are the fixed grids' idle programs the cost?); then the split kernel's
      # launch configurations (SplitConfig's sweep) on the captured form. Rows print as they
      # are measured and go to JSON lines, so a run cut short by its guard keeps them
      # (guards sum to 235 s: compiles dominate, the Triton cache in .jitcache cuts them)
      timeout 100 python3 -m benchmarks.bench_gdn_kernels --profile \
        --json "$OUT/gdn_paths.jsonl" 2>&1 | tee "$OUT/gdn_bench.log"
      timeout 25 python3 -m benchmarks.bench_gdn_kernels --paths captured --state-dtypes float32 \
        --shapes 1x384 64d+1x384 --max-rows 68 --json "$OUT/gdn_rows68.jsonl" 2>&1 \
        | tee -a "$OUT/gdn_bench.log"
      timeout 110 python3 -m benchmarks.bench_gdn_kernels --paths --state-dtypes float32 \
        --sweep --json "$OUT/gdn_sweep.jsonl" 2>&1 | tee -a "$OUT/gdn_bench.log" ;;
    accuracy)  # engine.state_dtype bfloat16 (or float16: --state-dtype) against float32: greedy
      # agreement at 0.8b (ACCURACY_ARGS and ACCURACY_TIMEOUT shrink it to fit a call)
      timeout ${ACCURACY_TIMEOUT:-400} python3 -m benchmarks.bench_state_accuracy --size 0.8b \
        ${ACCURACY_ARGS:---requests 16 --prompt 128 --tokens 512} 2>&1 | tail -n 30 | tee "$OUT/state_accuracy.log" ;;
    gdn)  # our chunked Gated DeltaNet kernel: its tests, then a prefill step on it (profiled)
      timeout 300 python3 -m pytest -m gpu -q -rA tests/test_gpu_kernels.py tests/test_gpu.py \
        -k "${GDN_TESTS:-gated_deltanet or orpheus}" 2>&1 | tee "$OUT/gpu_tests.log"
      timeout 120 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 20 \
        --graphs --piecewise ${GDN_MODE:-} --gdn-prefill triton --prefill 1x384 4x256 \
        --profile /tmp/profile_gdn 2>&1 | grep -E "step,|Error|error" | tee -a "$OUT/bench_step.log"
      cat /tmp/profile_gdn.prefill_* > "$OUT/gdn_profiles.txt" ;;
    run)  # one bench run at RUN_C (default 64); RUN_ARGS replaces the default arms (graphs off vs on)
      timeout 560 python3 -m harness run qwen35 -c ${RUN_C:-64} --abba \
        ${RUN_ARGS:---requests 320 --warmup 64 --arm eager=engine.cuda_graphs=false --arm graphs=engine.cuda_graphs=true} \
        --out /tmp/run-c64 2>&1 | tee "$OUT/bench_run.log"
      cp /tmp/run-c64/summary.json "$OUT/run_c64_summary.json" 2>/dev/null ;;
    verdicts)  # issue 34 on the H200: 2 ABBA blocks at c=64 with a ~3% GPU-side delay planted
      # in arm B (engine.planted_gpu_delay_us, VERDICT_DELAY_US, default 70 of a ~2.3 ms step)
      # must exit 1, and an A/A run of the same load exit 0. VERDICTS="planted aa" picks them.
      # VERDICT_SET="engine.k=v,...": settings of both arms.
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
      done ;;
    evidence)  # EVIDENCE="name:engine.key[+engine.key2][:A:B] ..." each an ABBA comparison key=A (arm
      # (of EVIDENCE_SCENARIO, default qwen35, at EVIDENCE_C, default 64)
      # "off", default false) vs key=B ("on", default true), 3 blocks, report; one tarball
      # back per comparison. A comparison starts only while EVIDENCE_UNTIL (seconds since
      # this stage began, default 300) has not passed. EVIDENCE_CONTINUE=DIR (a carried,
      # git-ignored folder, e.g. .evidence): a comparison whose ev-<name>.tgz from an earlier
      # call lies there adds its blocks to that run (bench run --continue, the same command);
      # the tarballs then keep the tables, so the next call can continue them again.
      # The load: 320 requests (5 a client at c=64) so each server's steady window holds whole
      # requests and so TTFT/TPOT/E2E (session 9's 128 left them empty: 2 a client); a
      # server's start (~40 s with graphs) costs far more than the ~4 s they add.
      began=$SECONDS
      for spec in ${EVIDENCE:-graphs:engine.cuda_graphs}; do
        IFS=: read -r name key a b <<< "$spec"; a=${a:-false}; b=${b:-true}
        IFS=+ read -r -a keys <<< "$key"  # engine.k1+engine.k2: both settings in each arm
        off=$(printf "%s=$a," "${keys[@]}") on=$(printf "%s=$b," "${keys[@]}")
        if (( SECONDS - began > ${EVIDENCE_UNTIL:-300} )); then echo "skipped $name"; continue; fi
        echo "== $name ($key) at $((SECONDS - began)) s"
        rm -rf "/tmp/ev-$name" "/tmp/ev-$name.log"  # a run directory must be new or empty
        more=() keep=(--exclude='*.parquet')
        if [ -n "${EVIDENCE_CONTINUE:-}" ]; then
          keep=()
          if [ -f "$EVIDENCE_CONTINUE/ev-$name.tgz" ]; then
            tar -x -z -C /tmp -f "$EVIDENCE_CONTINUE/ev-$name.tgz" && more=(--continue)
            echo "continuing the run of $EVIDENCE_CONTINUE/ev-$name.tgz"
          fi
        fi
        # --time-budget ends the schedule between whole blocks; the timeout only guards a hang
        timeout $(( ${EVIDENCE_BUDGET:-300} + 150 )) python3 -m harness run \
          ${EVIDENCE_SCENARIO:-qwen35} -c ${EVIDENCE_C:-64} --abba \
          --blocks 3 --time-budget ${EVIDENCE_BUDGET:-300} --report \
          ${EVIDENCE_LOAD:---requests 320 --warmup 64} --out /tmp/ev-$name "${more[@]}" \
          --arm "off=${off%,}" --arm "on=${on%,}" > /tmp/ev-$name.log 2>&1
        echo "exit $? after $((SECONDS - began)) s" | tee -a /tmp/ev-$name.log
        python3 scripts/run_counts.py /tmp/ev-$name >> /tmp/ev-$name.log 2>&1
        head -n 30 /tmp/ev-$name.log
        mkdir -p /tmp/ev-$name  # each call's log after the last's
        cat /tmp/ev-$name.log >> /tmp/ev-$name/bench_run.log && rm /tmp/ev-$name.log
        tar -C /tmp -c -z -f "$OUT/ev-$name.tgz" "${keep[@]}" "ev-$name"
      done ;;
    orpheus)  # the Orpheus GPU figures (size 3b): audio-seconds/s at c=32 and c=64
      for c in 32 64; do
        timeout 280 python3 -m harness run orpheus -c $c --abba --requests $((2 * c)) \
          --warmup 16 --out /tmp/orpheus-c$c 2>&1 | head -n 40 | tee -a "$OUT/orpheus.log"
      done ;;
    orpheus_step)  # Orpheus 3b's LLM apart from the server: its decode step alone (batch 64,
      # context 256, graphs, its logit mask; the GPU's busy time a step) with FlashInfer's
      # decode on CUDA cores and on tensor cores (3b's query group is 3), and with our GEMM for
      # the LM head (engine.dense_kernel head). 3 x 160 s of guards: session 9's 100 s each
      # returned nothing (a 3b build, its graphs and the step's compiles outran them)
      for opt in --no-decode-tensor-cores --decode-tensor-cores \
        "--decode-tensor-cores --dense-kernel head"; do
        timeout 160 python3 -m benchmarks.bench_gpu_step --scenario orpheus --size 3b \
          --batch 64 --context 256 --graphs $opt --profile "$OUT/orpheus_step${opt//[ -]/}.txt" \
          2>&1 | grep -E "decode step|GPU busy|Error|error" | tee -a "$OUT/orpheus_step.log"
      done ;;
    orpheus_iter)  # the worker's iteration with both nodes (64 requests, strict and overlapped
      # loops, the scenario's settings), profiled by CUDA stream (docs/ORPHEUS.md);
      # ORPHEUS_ITER_ARGS adds e.g. --codec-overlap (session 8's 150 s cut the overlapped loop)
      timeout 250 python3 -m benchmarks.bench_orpheus_iteration --size 3b --requests 64 \
        --profile "$OUT/orpheus_iteration_profile.txt" ${ORPHEUS_ITER_ARGS:-} 2>&1 \
        | grep -v "^USDT" | tail -n 80 | tee -a "$OUT/orpheus_step.log" ;;
    codec)  # the codec graphs (engine.codec_graphs): their GPU tests, then, if they pass,
      # Orpheus 3b off vs on at c=64
      timeout 150 python3 -m pytest -m gpu -q -rA -s tests/test_gpu.py -k codec_graph 2>&1 \
        | tee "$OUT/codec_tests.log" \
        && timeout 450 python3 -m harness run orpheus -c 64 --abba --requests 128 --warmup 16 \
          --time-budget 330 \
          --arm off=engine.codec_graphs=false --arm on=engine.codec_graphs=true \
          --out /tmp/orpheus-codec 2>&1 | head -n 40 | tee "$OUT/orpheus_codec.log" ;;
    codec_overlap)  # the codec stage in two phases (engine.codec_overlap): its GPU tests, then,
      # if they pass, Orpheus 3b off vs on at c=64 (codec graphs on in both arms)
      timeout 150 python3 -m pytest -m gpu -q -rA -s tests/test_gpu.py -k codec_overlap 2>&1 \
        | tee "$OUT/codec_overlap_tests.log" \
        && timeout 450 python3 -m harness run orpheus -c 64 --abba --requests 128 --warmup 16 \
          --time-budget 330 --report \
          --arm off=engine.codec_overlap=false --arm on=engine.codec_overlap=true \
          --out /tmp/orpheus-codec-overlap 2>&1 | head -n 40 \
          | tee "$OUT/orpheus_codec_overlap.log" \
        ; tar -C /tmp -c -z -f "$OUT/orpheus-codec-overlap.tgz" --exclude='*.parquet' \
          orpheus-codec-overlap 2>/dev/null ;;
    codec_kernels)  # the codec's Triton kernels (engine.codec_kernels): their GPU tests, then
      # the codec step at 3b (SNAC 24 kHz, bf16) for 1 to 64 windows, eager and on the codec
      # graphs, torch vs snake vs fused, profiled at 64 windows. The benchmark runs even if a
      # test fails: the torch arm's figures stand either way, and the log says which failed.
      timeout 240 python3 -m pytest -m gpu -q -rA -s tests/test_gpu_kernels.py tests/test_gpu.py \
        -k "snac_kernels or codec_kernels or orpheus_on_cuda_equals" 2>&1 \
        | tee "$OUT/codec_kernels_tests.log"
      timeout 330 python3 -m benchmarks.bench_codec --profile "$OUT/codec_kernels_profile.txt" \
        2>&1 | grep -v "^USDT" | tee "$OUT/bench_codec.log" ;;
    codec_folded)  # engine.codec_kernels folded (the residual units' 1x1 convs adding into
      # their inputs, their biases handed on): its GPU tests (tiny fp32 against torch, eager
      # and on the codec graphs; 3b bf16 against fp32), then the 3b codec step fused vs folded
      # at 16 and 64 windows, eager and on graphs, profiled at 64 (~4 minutes in all)
      timeout 100 python3 -m pytest -m gpu -q -rA -s tests/test_gpu.py \
        -k "codec_kernels and folded" 2>&1 | tail -n 8 | tee "$OUT/codec_folded_tests.log"
      timeout 90 python3 -m benchmarks.bench_codec --kernels fused folded --windows 16 64 \
        --repeats 20 --profile "$OUT/codec_folded_profile.txt" 2>&1 | grep -v "^USDT" \
        | tee "$OUT/bench_codec.log" ;;
    codec_next)  # engine.codec_sine approx (the SFU's sine in the codec's Triton kernels) and
      # engine.codec_kernels folded_noise (the noise blocks and transposed convs' biases
      # folded too): their GPU tests (tiny fp32 against torch, eager and on the codec graphs;
      # 3b bf16 against fp32), then the 3b codec step on folded and folded_noise, each with
      # exact and approx sines, at 16 and 64 windows, eager and on graphs, profiled at 64
      # (~3 minutes)
      timeout 120 python3 -m pytest -m gpu -q -rA -s tests/test_gpu.py \
        -k "codec_kernels and (approx or folded_noise)" 2>&1 | tail -n 12 \
        | tee "$OUT/codec_next_tests.log"
      timeout 150 python3 -m benchmarks.bench_codec --kernels folded folded_noise \
        --sines exact approx --windows 16 64 --repeats 20 \
        --profile "$OUT/codec_next_profile.txt" 2>&1 | grep -v "^USDT" \
        | tee "$OUT/bench_codec_next.log" ;;
    gemm)  # engine.dense_kernel (our GEMM for few rows, engine/kernels/triton_gemm.py): each
      # real shape torch vs ours (bench_gemm, no model built), then the 0.8b decode step at
      # batch 64 with graphs both ways, profiled (the GPU's busy time a step), then its GPU
      # tests in what is left of the call (the 0.8b engine test builds three models).
      # Guards: 120 + 2 x 150 + the rest of 570 s.
      timeout 120 python3 -m benchmarks.bench_gemm --json "$OUT/gemm.jsonl" 2>&1 \
        | tee "$OUT/bench_gemm.log"
      for dense in torch triton; do
        timeout 150 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --graphs \
          --dense-kernel $dense --profile "$OUT/profile_gemm_$dense.txt" 2>&1 \
          | grep -E "decode step|GPU busy|Error|error" | tee -a "$OUT/bench_step.log"
      done
      left=$((570 - SECONDS))
      [ $left -gt 60 ] && timeout $left python3 -m pytest -m gpu -q -rA -s \
        tests/test_gpu_kernels.py tests/test_gpu.py -k "skinny or dense_kernel" 2>&1 \
        | tail -n 40 | tee "$OUT/gemm_tests.log" ;;
    pdl_tests)  # engine.pdl (programmatic dependent launch, engine/kernels/triton_pdl.py): the
      # mechanism on this GPU (eager and in a graph: an early start seen, the wait ordering),
      # a decode chain's kernels equal to their plain launches, 0.8b's tokens equal (~2 min)
      timeout 240 python3 -m pytest -m gpu -v -rA tests/test_gpu_kernels.py tests/test_gpu.py \
        -k pdl 2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" \
        | tee "$OUT/pdl_tests.log" ;;
    pdl)  # engine.pdl on 0.8b's decode step at batch 64 (graphs), dense GEMMs torch / ours x
      # pdl off / on: the step as the engine runs it (median of 50), then 200 back-to-back
      # replays of its graph (the device time alone, CUDA events). ~40 s a run.
      for dense in torch triton; do
        for pdl in no-pdl pdl; do
          timeout 100 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --graphs \
            --steps 50 --dense-kernel $dense --$pdl --replays 200 2>&1 \
            | grep -E "decode step|replay|Error|error" | tee -a "$OUT/bench_pdl.log"
        done
      done ;;
    pipelined)  # engine.gdn_decode pipelined (the decode recurrence persistent, its state loads
      # pipelined through shared memory; engine/kernels/triton_gdn.py): its GPU tests, then
      # one layer call at 64 and 128 rows, the grid's launch against the pipelined kernel under
      # each launch of PIPELINED_SWEEP (bench_gdn_kernels --recurrent), then 0.8b's decode step
      # on graphs both ways (the step, 200 back-to-back replays; PIPELINED_STEP=0 leaves the
      # step out). ~4 minutes.
      timeout 200 python3 -m pytest -m gpu -v -rA -s tests/test_gpu_kernels.py tests/test_gpu.py \
        -k pipelined 2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|bit for bit|tokens as" \
        | tee "$OUT/pipelined_tests.log"
      timeout 150 python3 -m benchmarks.bench_gdn_kernels --paths triton --shapes 64d \
        --state-dtypes float32 --recurrent 64:4 --json "$OUT/gdn_pipelined.jsonl" 2>&1 \
        | tee "$OUT/gdn_pipelined.log"
      [ "${PIPELINED_STEP:-1}" = 1 ] && for form in grid pipelined; do
        timeout 100 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --graphs \
          --steps 50 --gdn-decode $form --replays 200 --profile "$OUT/step_$form.txt" 2>&1 \
          | grep -E "decode step|replay|Error|error" | tee -a "$OUT/bench_pipelined.log"
      done ;;
    split)  # engine.split_mixed (a mixed step's decode rows on their graph, its prompt rows on
      # the piecewise runner after them): the fence test (one staged buffer that waits), the
      # row choice that does not wait (take_rows), 0.8b's tokens against apart steps, then the closed loop (the stage below) on the defaults and
      # split (and split with captured Gated DeltaNet; SPLIT_OPTS), ~5 minutes
      timeout 200 python3 -m pytest -m gpu -v -rA -s tests/test_gpu_double_buffer.py \
        tests/test_gpu.py tests/test_gpu_kernels.py \
        -k "fence or split_mixed or one_host_buffer or taking_a_steps_rows or prefill_plan" 2>&1 \
        | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|tokens as" | tee "$OUT/split_tests.log"
      CLOSED_OPTS="${SPLIT_OPTS-;--set engine.prefill_stream=false --set engine.split_mixed=true;--set engine.prefill_stream=false --set engine.split_mixed=true --set engine.piecewise_gdn=true}" ;&
    closed)  # the c=64 server's closed loop in process (bench_decode_loop --closed: each request
      # that ends replaced at once, the scenario's lengths, prefill steps and the hold as
      # served, no HTTP): output tok/s, decode and prompt iterations apart with their host
      # and wait spans, on the defaults and with each candidate (CLOSED_ARGS: extra options of
      # every run): PDL, the pipelined recurrence, both, kept launches and captured Gated
      # DeltaNet (the last two for the prefill steps); the defaults' run profiled over 90
      # iterations (arrivals go on: ~5 of them prompt iterations). ~45 s a run, ~5 minutes.
      # CLOSED_OPTS: the runs' options instead, ';'-separated ("" for the defaults)
      IFS=';' read -r -a runs <<< "${CLOSED_OPTS-;--pdl;--gdn-decode pipelined;--pdl --gdn-decode pipelined;--set engine.triton_launch=bound;--set engine.piecewise_gdn=true}"
      closed_loop ;;
    pstream)  # engine.prefill_stream (prefill steps on a stream of their own beside the
      # decode steps): its GPU tests (tiny fp32 against the CPU reference; 0.8b's tokens
      # against one stream's, eager and captured Gated DeltaNet), then the closed loop on the
      # defaults (prefill_stream and piecewise_gdn on at 0.8b since session 18), without both,
      # and without the stream (PSTREAM_OPTS, ';'-separated as CLOSED_OPTS). ~4 minutes
      timeout 300 python3 -m pytest -m gpu -v -rA -s tests/test_gpu.py -k "prefill_stream" \
        2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|tokens as" \
        | tee -a "$OUT/pstream_tests.log"
      IFS=';' read -r -a runs <<< "${PSTREAM_OPTS-;--set engine.prefill_stream=false --set engine.piecewise_gdn=false;--set engine.prefill_stream=false}"
      closed_loop ;;
    loop)  # the served decode iteration apart (benchmarks/bench_decode_loop.py): 0.8b's worker,
      # 64 requests of 512 tokens decoding, strict and overlapped loops, pdl off and on: the
      # iteration, the worker's spans (host work vs the completion wait), the GPU's busy time
      # an iteration (profiled). Session 16 (overlapped, 150 iterations): GPU-bound, 2.205 ms
      # an iteration, 2.163 with pdl (docs/BENCHMARKS.md). ~40 s a worker, 4 of them.
      for pdl in no-pdl pdl; do
        timeout 200 python3 -m benchmarks.bench_decode_loop --size 0.8b --loop both --$pdl \
          --profile "$OUT/loop_$pdl.txt" 2>&1 | grep -v "^USDT" | tee -a "$OUT/bench_loop.log"
      done ;;
    recurrent)  # the recurrence's launch (value columns x warps a program) on decode steps of
      # 64 and 128 rows, one layer call (a decode step's largest kernel: 39.6 us a layer)
      timeout 150 python3 -m benchmarks.bench_gdn_kernels --paths --state-dtypes float32 \
        --recurrent --json "$OUT/gdn_recurrent.jsonl" 2>&1 | tee "$OUT/gdn_recurrent.log" ;;
    kept)  # engine.triton_launch bound (engine/kernels/triton_launch.py): its GPU tests, the
      # launch's host cost (bench_launch's kept rows), then the eager decode step and prefill
      # steps beside 64 decoding rows, and one Gated DeltaNet layer call, jit against bound
      # (guards: 120 + 40 + 2 x 60 + 2 x 100 + 2 x 50 = 580 s; the GDN layer's "host us")
      timeout 120 python3 -m pytest -m gpu -v tests/test_gpu_kernels.py tests/test_gpu.py \
        -k kept 2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed|Error" | tee "$OUT/kept_tests.log"
      timeout 40 python3 -m benchmarks.bench_launch 2>&1 | tee "$OUT/bench_launch.log"
      for launch in jit bound; do
        timeout 60 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 30 \
          --no-graphs --no-piecewise --triton-launch $launch 2>&1 \
          | grep -E "decode step|Error|error" | tee -a "$OUT/bench_step.log"
        timeout 100 python3 -m benchmarks.bench_gpu_step --batch 64 --context 512 --steps 30 \
          --graphs --piecewise --prefill 1x128 1x384 4x256 --triton-launch $launch 2>&1 \
          | grep -E "decode step|step,|Error|error" | tee -a "$OUT/bench_step.log"
      done
      for launch in jit bound; do
        timeout 50 python3 -m benchmarks.bench_gdn_kernels --paths triton triton_split \
          --shapes 1x128 1x384 4x256 --state-dtypes float32 --triton-launch $launch 2>&1 \
          | tee -a "$OUT/gdn_launch.log"
      done ;;
    masked)  # engine.masked_head (the LM head over Orpheus's audio codes alone): its GPU test
      # and the whole-head one beside it, then Orpheus 3b's LLM decode step (batch 64, context
      # 256, graphs, tensor-core decode as the 3b size runs it) with the whole head and the
      # masked one, profiled (the GPU's busy time a step). Guards: 150 + 2 x 160 s.
      timeout 150 python3 -m pytest -m gpu -v tests/test_gpu.py \
        -k "masked_head or tiny_orpheus_on_cuda_equals" 2>&1 \
        | grep -E "PASSED|FAILED|ERROR|passed|failed|Error" | tee "$OUT/masked_tests.log"
      for mh in --no-masked-head --masked-head; do
        timeout 160 python3 -m benchmarks.bench_gpu_step --scenario orpheus --size 3b \
          --batch 64 --context 256 --graphs --decode-tensor-cores $mh \
          --profile "$OUT/orpheus_step${mh//-/}.txt" 2>&1 \
          | grep -E "decode step|GPU busy|Error|error" | tee -a "$OUT/orpheus_step.log"
      done ;;
    statesteps)  # engine.state_dtype float32 vs STATE_DTYPE (default float16) on the 0.8b
      # decode step (batch STATE_BATCH, default 64, 512-token contexts, graphs), alternating
      # by process, STATE_PAIRS pairs (default 2), each profiled: the GPU's busy time a step
      # decides, the wall figure carries the ~10% process-to-process noise
      for i in $(seq "${STATE_PAIRS:-2}"); do
        for sd in float32 "${STATE_DTYPE:-float16}"; do
          timeout 120 python3 -m benchmarks.bench_gpu_step --batch "${STATE_BATCH:-64}" \
            --context 512 --graphs --state-dtype "$sd" --profile "$OUT/state_${sd}_$i.txt" 2>&1 \
            | grep -E "decode step|GPU busy|Error|error" | sed "s/^/$sd #$i: /" \
            | tee -a "$OUT/state_steps.log"
        done
      done ;;
    figures)  # the issues' figures on the current defaults: one fresh server each at
      # FIGURES_C (default "64 128"; FIGURES_SCENARIO, default qwen35), 4 x C measured + C
      # warmup requests; the figures table and the iteration's phases (~40 s a 0.8b server)
      # FIGURES_SET="engine.KEY=VALUE,...": settings over the scenario's CUDA size, in a copy
      # of its file (bench measure takes a scenario file)
      scenario=${FIGURES_SCENARIO:-qwen35}
      if [ -n "${FIGURES_SET:-}" ]; then
        python3 - "$scenario" "$FIGURES_SET" <<'PY' || exit 3
import sys, yaml
from engine.config import parse_overrides, scenario_path
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
        # a first server on a fresh machine may compile what the JIT cache lacks: its warmup
        # line says how long (session 15: 179 s before FlashInfer's .so files loaded as they
        # are; a guard of 200 s then cut a run with 16 requests in flight, counted failed)
        run="/tmp/figures-c$c-$RANDOM"
        timeout 300 python3 -m harness measure "$scenario" -c "$c" \
          --requests $((4 * c)) --warmup "$c" --out "$run" > "$run.log" 2>&1
        { head -n 24 "$run.log"; grep -E "^doubt|^interrupted" "$run.log"
          grep -h "warmup:" "$run"/logs/*.log 2>/dev/null | cut -c 12-170
          failures "$run"; } | tee -a "$OUT/figures.log"
      done ;;
    decode_attn|decode_attn_3b|decode_tests)  # engine.decode_attention triton (our split kernel)
      # against FlashInfer's, in two calls of ~5 minutes (a machine taken back mid-call
      # returns nothing). `decode_attn`: the kernel's GPU tests and the engine's 0.8b decode
      # graphs on it (every bucket's replay against eager), the kernel benchmark (one layer
      # call in graphs, both models' heads, rows 1-128, contexts 256-2048; DECODE_SWEEP=1 adds
      # our split counts and launches), then 0.8b decode steps with each kernel (batch 64,
      # context 512, graphs; ~40 s a run), profiled (the GPU's busy time a step, its
      # kernels). `decode_attn_3b`: Orpheus 3b's steps with each (batch 64, graphs,
      # tensor-core decode, masked head; ~130 s a run) at context 768, near a served row's
      # mean (prompts of 16-64 tokens, 700-1400 audio tokens). One budget a stage
      # (DECODE_BUDGET, 330 s): each run's guard is cut to what is left of it, and a run left
      # under 30 s is skipped with a line saying so. The benchmark's guard allows FlashInfer's
      # JIT compile of a decode kernel no cache holds (3b's CUDA-core decode has not run since
      # session 9). Each run's whole output goes to its log; its result lines to the terminal.
      deadline=$((SECONDS + ${DECODE_BUDGET:-330}))
      run_guarded() {  # run_guarded SECONDS LOG COMMAND...
        local limit=$(($deadline - SECONDS)) log=$2
        (( limit > $1 )) && limit=$1
        shift 2
        if (( limit < 30 )); then echo "skipped (decode_attn budget): $*" | tee -a "$OUT/$log"
        else timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$log" \
          | grep -E "PASSED|FAILED|ERROR|passed|failed|decode step|GPU busy|GB/s|Error|error"; fi
      }
      if [ "$stage" != decode_attn_3b ]; then  # our kernel's GPU tests (decode_tests: alone,
        # after a launch changed; decode_attn: FlashInfer's own beside them)
        also=""; [ "$stage" = decode_attn ] && also="flashinfer_attention or "
        run_guarded 150 decode_attn_tests.log python3 -m pytest -m gpu -v -rA --tb=short \
          tests/test_gpu_kernels.py tests/test_gpu.py \
          -k "triton_decode or ${also}08b_decode_graph_replay_equals_eager_for_every_bucket and triton"
      fi
      if [ "$stage" = decode_attn ]; then
        sweep=(); [ "${DECODE_SWEEP:-0}" = 1 ] && sweep=(--sweep)
        run_guarded 120 decode_attn_bench.log python3 -m benchmarks.bench_decode_attention \
          "${sweep[@]}" --json "$OUT/decode_attn.jsonl"
        for da in flashinfer triton; do
          run_guarded 75 decode_attn_steps.log python3 -m benchmarks.bench_gpu_step --batch 64 \
            --context 512 --graphs --decode-attention $da --profile "$OUT/profile_08b_$da.txt"
        done
      elif [ "$stage" = decode_attn_3b ]; then
        for da in flashinfer triton; do
          run_guarded 160 decode_attn_steps.log python3 -m benchmarks.bench_gpu_step \
            --scenario orpheus --size 3b --batch 64 --context 768 --graphs --decode-tensor-cores \
            --masked-head --decode-attention $da --profile "$OUT/profile_3b_$da.txt"
        done
      fi ;;
    overlap)  # would a prefill step on a stream of its own overlap the decode steps
      # (benchmarks/bench_prefill_overlap.py: two engines in one process, 0.8b, 64 rows
      # decoding on their graph, a prefill of 3 x 320 every 18 steps; the GPU alone under a
      # spin, then host-driven loops): eager Gated DeltaNet and captured. OVERLAP_OPTS:
      # the runs' options, ';'-separated ("" for the defaults). ~40 s a run.
      IFS=';' read -r -a runs <<< "${OVERLAP_OPTS-;--set engine.piecewise_gdn=true}"
      for opts in "${runs[@]}"; do
        timeout 150 python3 -m benchmarks.bench_prefill_overlap --size 0.8b $opts 2>&1 \
          | grep -v "^USDT" | tee -a "$OUT/bench_overlap.log" | grep -E "device|loop|rror"
      done ;;
    launch)  # what one launch costs the host (torch op, cuBLAS GEMM, Triton JIT and bound
      # runner, our wrappers): the eager step's host time divided among its launches
      timeout 60 python3 -m benchmarks.bench_launch 2>&1 | tee "$OUT/bench_launch.log" ;;
  esac
done
# At most 8 files come back from $OUT: past 6, the logs go into one logs.tgz (the JIT
# caches and the evidence tarballs stay apart).
shopt -s nullglob
logs=()
for f in "$OUT"/*; do case ${f##*/} in jit-*|*.tgz) ;; *) logs+=("${f##*/}") ;; esac; done
if (( ${#logs[@]} > 6 )); then tar -C "$OUT" -c -z -f "$OUT/logs.tgz" "${logs[@]}" \
  && (cd "$OUT" && rm -f "${logs[@]}"); fi
# Save the JIT caches (FlashInfer's compiled .so files; Triton's cubins, PTX and metadata, not
# its intermediate IRs, which a cache hit never reads: 23 -> 18.5 MB) for the next machine. A
# call carries the tracked tree, .whl and .jitcache: 64 MiB in all, ~62 MB in session 14.
tar -c -z -f /tmp/jit.tgz --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' \
  /tmp/fi/.cache/flashinfer/*/*/cached_ops/*/*.so /tmp/triton-cache \
  2>/dev/null && split -b 15M /tmp/jit.tgz "$OUT/jit-" && ls -la "$OUT"
