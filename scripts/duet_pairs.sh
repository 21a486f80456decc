#!/usr/bin/env bash
# Duet pairs (issue 41, docs/STATISTICS.md "Noise on a CPU"): two fresh tiny servers of the same
# code loaded at the same time, both workers on core 1 (the kernel shares it between them), their
# API servers and load generators on core 0; then each pair's ratio and shared noise
# (scripts/machine_noise.py --pair). How far apart two arms read when the machine's noise falls
# on both alike. Usage: bash scripts/duet_pairs.sh [PAIRS] [REQUESTS]   (default 4 512)
set -uo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-4} requests=${2:-512} out=${DUET_OUT:-/tmp/duet}
mkdir -p "$out"
for n in $(seq "$pairs"); do
  servers=() loads=()
  for port in 18001 18002; do
    BENCH_WORKER_CPUS=1 taskset -c 0 python -m engine serve qwen35 --size tiny --port $port \
      > "$out/server$n-$port.log" 2>&1 &
    servers+=($!)
  done
  for port in 18001 18002; do
    for _ in $(seq 120); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 0.5; done
  done
  for port in 18001 18002; do
    taskset -c 0 python -m harness measure "http://127.0.0.1:$port" --scenario qwen35 \
      --size tiny -c 64 --requests "$requests" --warmup 16 --out "$out/m$n-$port" --overwrite \
      > "$out/m$n-$port.log" 2>&1 &
    loads+=($!)
  done
  wait "${loads[@]}"
  kill "${servers[@]}"; wait "${servers[@]}" 2> /dev/null
  echo -n "pair $n: "; python scripts/machine_noise.py --pair "$out/m$n-18001" "$out/m$n-18002"
done
