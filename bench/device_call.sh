#!/usr/bin/env bash
# The next GPU session's first call (BENCHMARKS.md, "The next GPU session's calls", item 1), steps chosen by
# environment variables, each skipped when too little of the call's LIM seconds is left; logs in $OUT/STEP.log.
# Here, before the call: `bash bench/device_wheels.sh`; an older tree to A/B against (FN_TREE, GO's `old`):
#   mkdir -p old && git archive COMMIT | tar -x -C old, and /old/ in .git/info/exclude.
# The call (carry .whl and the trees):  KT=1 FN=1 FN_TREE=old GO=1 LIM=580 bash bench/device_call.sh
# A box goes back 30 s after a call: have the next command ready (GO=1 GOTL=1 FNTL=1 FAM=1 ...).
# The next session's first calls (BENCHMARKS.md): MXP=1 LIM=590, then MX=1 TRIAL=1 LIM=590 (carry .whl and peer).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); LIM=${LIM:-580}
left() { echo $(( LIM - ($(date +%s) - T0) )); }
step() {    # step NAME SECONDS_NEEDED COMMAND...
  local name=$1 need=$2 l; shift 2; l=$(left)
  if [ "$l" -lt "$need" ]; then echo "SKIP $name ($l s left)"; return; fi
  echo "=== $name ($l s left)"
  timeout $((l - 8)) "$@" 2>&1 | tee -a "$OUT/$name.log" | grep -v "warning\|^\s*$" | tail -"${TAILN:-30}"
  echo "=== $name rc ${PIPESTATUS[0]} at $(( $(date +%s) - T0 )) s"
}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
FN_ARGS="--preset qwen3.8-flash-next-4l --quant int8 --dense-quant int8 --prompt-tokens 512 --new-tokens 256 --device cuda --vram-budget 11GiB"
GO_ARGS="--preset gpt-oss-120b --quant mxfp4 --prompt-tokens 512 --new-tokens 128 --device cuda --vram-budget 8GB --ram-cache 8GB"
L=/root/lcp-build/bin/llama-bench
# MXP then MX (two calls on one warm box): a family beside llama.cpp (MXF, default gpt-oss-120b; MXR its regimes)
[ -n "${MXP:-}" ] && step matrix_prepare 300 python -m bench --out /root/mx matrix "${MXF:-gpt-oss-120b}" --regime \
  ${MXR:-fits-ram} --llama-bench $L --build-peer --prepare-only
[ -n "${MX:-}" ] && step matrix 150 bash -c "python -m bench --out /root/mx matrix ${MXF:-gpt-oss-120b} --regime \
  ${MXR:-fits-ram} --llama-bench $L --llama-timeout 90 && cp -r /root/mx/matrix.json /root/mx/llama-bench $OUT/"
# TRIAL: the CPU share's trial at a PCIe 4.0 x16 card's rate, against copying every miss
[ -n "${TRIAL:-}" ] && step share_trial 150 python -m bench ab --regime fits-ram --rounds "${R:-2}" \
  --variant copy_rate_gbps=25 --variant "copy_rate_gbps=25 cpu_experts=off" -- --preset olmoe-1b-7b --quant int8 \
  --dense-quant int8 --prompt-tokens 512 --new-tokens 256
[ -n "${KT:-}" ] && step kernel_tests 60 python -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_moe_decode.py \
  tests/families/test_qwen4_exp_gpu.py tests/streaming/test_runtime_equality.py
# KAB: the expert decode kernels' default configs in this tree and in base/ (an older tree: git archive COMMIT)
[ -n "${KAB:-}" ] && step kernel_ab 150 bash -c 'for t in base .; do echo "tree $t"; (cd $t && PYTHONPATH=/tmp/site:$PWD \
  python -m bench --out /tmp/kab-$t kernels --default-only --models gpt-oss-120b,olmoe-1b-7b --formats mxfp4,nvfp4,int8,fp8 \
  | grep " err "); done'
[ -n "${KSW:-}" ] && step kernel_sweep 120 python -m bench --out /tmp/ksw kernels --models gpt-oss-120b --formats mxfp4,nvfp4
[ -n "${GOTR:-}" ] && step go_trace 120 python -m bench profile --mode trace --preset gpt-oss-120b --quant mxfp4 \
  --budgets 8GB --ram-cache 8GB
[ -n "${FN:-}" ] && step fn_ab 100 python -m bench ab --rounds "${R:-2}" ${FN_TREE:+--tree $FN_TREE} -- $FN_ARGS
[ -n "${GO:-}" ] && step go_ab 150 python -m bench ab --rounds "${R:-2}" --tree "${GO_TREE:-old}" -- $GO_ARGS
[ -n "${FN64:-}" ] && step fn64_ab 100 python -m bench ab --rounds 1 ${FN_TREE:+--tree $FN_TREE} -- $FN_ARGS --new-tokens 64
[ -n "${FNTL:-}" ] && step fn_timeline 60 python -m bench profile --mode timeline --preset qwen3.8-flash-next-4l \
  --quant int8 --budgets 11GiB --tokens 256 --ram-cache default
[ -n "${GOTL:-}" ] && step go_timeline 60 python -m bench profile --mode timeline --preset gpt-oss-120b \
  --quant mxfp4 --budgets 8GB --tokens 64
[ -n "${GOSPY:-}" ] && step go_py_spy 100 python -m bench profile --mode py-spy --preset gpt-oss-120b \
  --quant mxfp4 --budgets 8GB --tokens 256
[ -n "${GOSP:-}" ] && step go_spans 90 python -m bench profile --mode spans --preset gpt-oss-120b \
  --quant mxfp4 --budgets 8GB --tokens 128 --ram-cache 8GB
[ -n "${GOSPI:-}" ] && step go_spans_gil 90 python -m bench profile --mode spans --preset gpt-oss-120b \
  --quant mxfp4 --budgets 8GB --tokens 128 --ram-cache 8GB --switch-interval 0.0002
[ -n "${GOSPF:-}" ] && step go_spans_no_fill 90 python -m bench profile --mode spans --preset gpt-oss-120b \
  --quant mxfp4 --budgets 8GB --tokens 128 --ram-cache 8GB --set ram_fill=false
[ -n "${FNSP:-}" ] && step fn_spans 90 python -m bench profile --mode spans --preset qwen3.8-flash-next-4l \
  --quant int8 --budgets 11GiB --tokens 256 --ram-cache default
[ -n "${RT:-}" ] && step runtime_tests 60 python -m pytest -q -p no:cacheprovider -n 4 -m gpu \
  tests/streaming/test_runtime_equality.py
[ -n "${FAM:-}" ] && step family_tests 120 python -m pytest -q -p no:cacheprovider -n 4 -m gpu \
  tests/families/test_gpt_oss.py tests/families/test_qwen4_exp_gpu.py tests/families/test_hybrid_runtime.py \
  tests/streaming/test_runtime_equality.py tests/families/test_families_gpu.py tests/families/test_dsa_gpu.py
echo "done at $(( $(date +%s) - T0 )) s"
