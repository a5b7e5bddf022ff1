#!/usr/bin/env bash
# Builds the sim port the way a hardware vendor would: trainyard installed into a prefix, then
# ports/sim configured and built against that prefix alone.
#   build_sim_port.sh BUILD_DIR OUT_DIR
# OUT_DIR/prefix is the install, OUT_DIR/build the port's plugins.
set -euo pipefail
build="$1"
out="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
torch_cmake="$("$root/.venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
rm -rf "$out/prefix"
cmake --install "$build" --prefix "$out/prefix" > /dev/null
# Objects are shared with other clones' builds of the port (see tools/build).
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
if [ ! -f "$out/build/build.ninja" ]; then
  cmake -S "$root/ports/sim" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$out/prefix;$torch_cmake" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache > /dev/null
fi
cmake --build "$out/build"
