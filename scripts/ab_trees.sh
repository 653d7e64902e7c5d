#!/usr/bin/env bash
# Alternated `sluice bench` runs of this tree against an earlier commit's tree, on one machine:
#   git archive <commit> -o old.tar       (here, before the device call: old.tar travels with the tree)
#   bash scripts/ab_trees.sh REGIME TOKENS ROUNDS [extra bench flags...]
# Each round runs the old tree, then this one; one line a run (decode, the syncs' wait, anonymous memory,
# file pages read a token, bytes copied to the GPU a token, the VRAM hit rate), the whole reports under $OUT/bench-*.txt.
set -u
regime=$1 tokens=$2 rounds=$3; shift 3
old=/tmp/old-tree
[ -d $old ] || { mkdir -p $old && tar -xf old.tar -C $old; }
for round in $(seq 1 "$rounds"); do
  for tree in old new; do
    dir=$([ $tree = old ] && echo $old || echo "$PWD")
    tag=$regime-$tree-$round
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 200 python3 -m engine.tools.cli bench --preset olmoe-1b-7b --quant int8 \
       --dense-quant int8 --prompt-tokens 512 --new-tokens "$tokens" --regime "$regime" --work-dir "${SLUICE_BENCH_DIR:-/tmp/sb}" \
       "$@" > "$OUT/bench-$tag.txt" 2>&1)
    echo "$tag: $(grep -E '^decode ' "$OUT/bench-$tag.txt" | head -1 | cut -c14-60) | waited$(grep -o 'waited [0-9.]* ms' "$OUT/bench-$tag.txt" | head -1 | cut -c7-) | $(grep -o '[0-9.]* MiB anonymous' "$OUT/bench-$tag.txt" | head -1) | $(grep -o '[0-9.]* pages a token' "$OUT/bench-$tag.txt" | head -1) | h2d$(grep '^per token' "$OUT/bench-$tag.txt" | grep -o 'h2d [0-9.]* GB' | cut -c4-) a token | $(grep -o 'VRAM [0-9.]*%' "$OUT/bench-$tag.txt" | head -1)"
  done
done
