#!/usr/bin/env bash
# llama.cpp source that travels to the offline GPU box (docs: /work/shared/peer/LLAMACPP.md).
# Fetches the sdist of llama-cpp-python 0.3.36 from PyPI (it vendors llama.cpp, ggml 0.25.3), keeps
# only vendor/llama.cpp, and trims it to what a CUDA build of llama-bench and convert_hf_to_gguf.py
# (with gguf-py) need, into an ignored folder (default: peer/llama.cpp in the repo root).
#   bash bench/fetch_llamacpp.sh [DEST]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/peer/llama.cpp}"
VERSION=0.3.36
PY="${PYTHON:-python3}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$TMP" 2>&1 \
    | grep -v "is ignored" || true
tar xzf "$TMP"/llama_cpp_python-"$VERSION".tar.gz -C "$TMP" "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="$TMP/llama_cpp_python-$VERSION/vendor/llama.cpp"

cd "$SRC"
# Not needed to build llama-bench or to convert (LLAMACPP.md); vendor/miniaudio stays (CMake adds it).
# tools/* other than ui stay: tools/CMakeLists.txt adds each folder unconditionally.
rm -rf models docs media benches tests tools/ui .github .devops ci pocs skills app examples \
       grammars requirements scripts
# Backends this build never uses (CUDA and CPU stay).
(cd ggml/src && rm -rf ggml-et ggml-metal ggml-hexagon ggml-sycl ggml-vulkan ggml-opencl ggml-cann \
       ggml-musa ggml-hip ggml-kompute ggml-webgpu ggml-zdnn ggml-openvino ggml-virtgpu ggml-zendnn)
# CPU kernels for other architectures: the box is x86_64.
(cd ggml/src/ggml-cpu/arch && rm -rf arm loongarch powerpc riscv s390 wasm)

mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST"
mv "$SRC" "$DEST"
echo "llama.cpp $VERSION (vendored by llama-cpp-python) in $DEST: $(du -sh "$DEST" | cut -f1)"
