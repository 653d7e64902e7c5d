#!/usr/bin/env bash
# Install Sluice into ./.venv.  Usage: bash packaging/install.sh [--dev]
#   --dev   also install the test tools (pytest, pytest-qt, accelerate, triton for the kernel interpreter tests)
# torch goes in first so that nothing else pulls a multi-GB build of its own choosing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "Sluice needs Python 3.10 or newer ($PY was not found): install it, or set PYTHON=/path/to/python3." >&2
    exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "Sluice needs Python 3.10 or newer; $("$PY" --version 2>&1) was found. Set PYTHON=/path/to/python3.11 or newer." >&2
    exit 1
fi
# About 2.5 GB installed (3.5 GB with the test tools; more with PyTorch's CUDA build): say so before pip
# fills the disk halfway and stops with an OSError.
need_mb=$([ "${1:-}" = "--dev" ] && echo 3500 || echo 2500)
free_mb=$(df -Pm . 2>/dev/null | awk 'NR == 2 {print $4}')
if [ ! -x .venv/bin/sluice ] && [ -n "$free_mb" ] && [ "$free_mb" -lt "$need_mb" ]; then
    echo "Sluice needs about $((need_mb / 1000)).$((need_mb % 1000 / 100)) GB free in $(pwd) to install (more with PyTorch's CUDA build), but only ${free_mb} MB is free: free some space, or put Sluice on a larger disk, and run this again." >&2
    exit 1
fi
if [ ! -x .venv/bin/python ] && ! "$PY" -m venv .venv >/dev/null 2>&1; then
    rm -rf .venv
    echo "Could not create a virtual environment: install Python's venv module (Debian/Ubuntu: sudo apt install python3-venv) and run this again." >&2
    exit 1
fi
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    # PyPI's Linux torch wheel is the CUDA build; a CPU-only machine may be pointed at the CPU wheel by pip config.
    $PIP install -q "torch==2.13.0"
fi
if [ "${1:-}" = "--dev" ]; then
    $PIP install -q -e ".[dev]"
else
    $PIP install -q -e .
fi
echo "Sluice installed in $(pwd)/.venv  (run: .venv/bin/sluice)"
