# One line from a `sluice bench` report: decode, the syncs' wait, anonymous memory, file pages read a token, bytes
# copied to the GPU a token, the VRAM hit rate. Sourced by scripts/ab_trees.sh and scripts/ab_env.sh.
bench_summary() {
  local f=$1
  echo "$(grep -E '^decode ' "$f" | head -1 | cut -c14-60) | waited$(grep -o 'waited [0-9.]* ms' "$f" | head -1 | cut -c7-) | $(grep -o '[0-9.]* MiB anonymous' "$f" | head -1) | $(grep -o '[0-9.]* pages a token' "$f" | head -1) | h2d$(grep '^per token' "$f" | grep -o 'h2d [0-9.]* GB' | cut -c4-) a token | $(grep -o 'VRAM [0-9.]*%' "$f" | head -1) | reads waited$(grep -o 'waited for reads [0-9.]* ms' "$f" | head -1 | cut -c17-)"
}
