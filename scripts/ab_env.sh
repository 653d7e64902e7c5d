#!/usr/bin/env bash
# Alternated `sluice bench` runs of this tree under several environments (switches), on one machine:
#   bash scripts/ab_env.sh REGIME TOKENS ROUNDS "A=1" "A=0 B=8" ... [-- extra bench flags...]
# Each round runs every setting in turn ("-" for none); one line a run (bench_summary in scripts/bench_lib.sh), the whole
# reports under $OUT/bench-*.txt.
set -u
source "$(dirname "$0")/bench_lib.sh"
regime=$1 tokens=$2 rounds=$3; shift 3
settings=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do settings+=("$1"); shift; done
[ $# -gt 0 ] && shift
for round in $(seq 1 "$rounds"); do
  for i in "${!settings[@]}"; do
    setting=${settings[$i]}
    tag=$regime-$i-$round
    env_args=(); [ "$setting" != "-" ] && read -ra env_args <<< "$setting"
    ([ ${#env_args[@]} -eq 0 ] || export "${env_args[@]}"; bench_run "$regime" "$tokens" "$OUT/bench-$tag.txt" "$@")
    echo "$tag [$setting]: $(bench_summary "$OUT/bench-$tag.txt")"
  done
done
