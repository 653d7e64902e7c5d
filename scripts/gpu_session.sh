#!/usr/bin/env bash
# One device call: the GPU-marked tests (every kernel against its torch reference on this GPU), then the A/B of
# this tree against an older one (old.tar: `git archive <commit>`) through Engine.generate. Output under $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${TESTS_S:-300}" python3 -m pytest -q -p no:cacheprovider -rfE -m gpu tests --ignore=tests/app --ignore=tests/serve \
    > "$OUT/pytest_gpu.txt" 2>&1
tail -15 "$OUT/pytest_gpu.txt"
if [ -f old.tar ] && [ "${AB_S:-0}" -gt 0 ]; then
  mkdir -p /tmp/old && tar -xf old.tar -C /tmp/old
  timeout "$AB_S" python3 -m bench ab --regime fits-ram --rounds "${ROUNDS:-2}" --tree /tmp/old -- --preset olmoe-1b-7b --quant int8 \
      --dense-quant int8 --prompt-tokens 512 --new-tokens 128 > "$OUT/ab.txt" 2>&1
  tail -12 "$OUT/ab.txt"
fi
