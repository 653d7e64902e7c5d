#!/usr/bin/env bash
# Alternated `sluice bench` runs of this tree against an earlier commit's tree, on one machine:
#   git archive <commit> -o old.tar       (here, before the device call: old.tar travels with the tree)
#   bash scripts/ab_trees.sh REGIME TOKENS ROUNDS [extra bench flags...]
# Each round runs the old tree, then this one; one line a run (bench_summary in scripts/bench_lib.sh), the whole reports under
# $OUT/bench-*.txt.
set -u
source "$(dirname "$0")/bench_lib.sh"
regime=$1 tokens=$2 rounds=$3; shift 3
old=/tmp/old-tree
[ -d $old ] || { mkdir -p $old && tar -xf old.tar -C $old; }
for round in $(seq 1 "$rounds"); do
  for tree in old new; do
    dir=$([ $tree = old ] && echo $old || echo "$PWD")
    tag=$regime-$tree-$round
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir bench_run "$regime" "$tokens" "$OUT/bench-$tag.txt" "$@")
    echo "$tag: $(bench_summary "$OUT/bench-$tag.txt")"
  done
done
