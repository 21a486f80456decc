#!/usr/bin/env bash
# What a device call would carry, against the 64 MiB it may: the working tree (tracked files
# and untracked ones git does not ignore) and the ignored paths it names in carry (by default
# .whl and .jitcache). Session 14 lost a call to a carry of ~68 MB (docs/BENCHMARKS.md).
#   bash scripts/carry_size.sh [PATH...]
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((64 * 1024 * 1024))
bytes() { if [ "$#" -gt 0 ]; then du -cb "$@" 2>/dev/null | tail -n 1 | cut -f 1; else echo 0; fi; }
mapfile -d '' tree < <(git ls-files -z --cached --others --exclude-standard)
existing=()
for f in "${tree[@]}"; do [ -f "$f" ] && existing+=("$f"); done
total=$(bytes "${existing[@]}")
printf '%-12s %6.1f MiB\n' tree "$(echo "$total / 1048576" | bc -l)"
carry=("$@")
[ "${#carry[@]}" -eq 0 ] && carry=(.whl .jitcache)
for path in "${carry[@]}"; do
  size=$(bytes "$path")
  total=$((total + size))
  printf '%-12s %6.1f MiB\n' "$path" "$(echo "$size / 1048576" | bc -l)"
done
printf '%-12s %6.1f MiB of 64 (%s)\n' total "$(echo "$total / 1048576" | bc -l)" \
  "$([ "$total" -le "$limit" ] && echo fits || echo 'too large: carry less')"
[ "$total" -le "$limit" ]
