#!/usr/bin/env bash
# Wheels the GPU box lacks, into .whl/ (ignored; name it in the device call's carry): the pinned transformers and
# huggingface_hub, llguidance and uvicorn (the box ships transformers 5.17, whose gpt-oss experts ignore the config's clamp limit, so
# the random test models differ from the reference there), their pure-Python dependencies the box lacks,
# platformdirs, and py-spy for the decode profiles. Run here, before the call:
#   bash bench/device_wheels.sh
# then begin the device command with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
set -eu
cd "$(dirname "$0")/.."
pin() { grep -o "\"$1==[^\"]*\"" pyproject.toml | tr -d '"'; }
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl \
  "$(pin transformers)" "$(pin huggingface_hub)" "$(pin llguidance)" "$(pin uvicorn)" httpx2 httpcore2 truststore \
  platformdirs py-spy
ls .whl
