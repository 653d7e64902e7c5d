# Shell helpers of scripts/ab_trees.sh and scripts/ab_env.sh (sourced).

# bench_run REGIME TOKENS OUT [extra bench flags...]: `sluice bench` of the bench model (OLMoE dims, int8 experts and
# dense weights, a 512-token prompt) from the current directory, its report into OUT.
bench_run() {
  local regime=$1 tokens=$2 out=$3; shift 3
  timeout 200 python3 -m engine.tools.cli bench --preset olmoe-1b-7b --quant int8 --dense-quant int8 --prompt-tokens 512 \
    --new-tokens "$tokens" --regime "$regime" --work-dir "${SLUICE_BENCH_DIR:-/tmp/sb}" "$@" > "$out" 2>&1
}

# bench_summary REPORT: one line: decode, the syncs' wait, anonymous memory, file pages read a token, bytes copied to
# the GPU a token, the VRAM hit rate, the decode's wait for reads.
bench_summary() {
  local f=$1
  echo "$(grep -E '^decode ' "$f" | head -1 | cut -c14-60) | waited$(grep -o 'waited [0-9.]* ms' "$f" | head -1 | cut -c7-) | $(grep -o '[0-9.]* MiB anonymous' "$f" | head -1) | $(grep -o '[0-9.]* pages a token' "$f" | head -1) | h2d$(grep '^per token' "$f" | grep -o 'h2d [0-9.]* GB' | cut -c4-) a token | $(grep -o 'VRAM [0-9.]*%' "$f" | head -1) | reads waited$(grep -o 'waited for reads [0-9.]* ms' "$f" | head -1 | cut -c17-)"
}
