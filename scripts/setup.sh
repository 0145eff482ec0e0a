#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test qstage, then builds it into
# ./build. Both README commands and CI (.ci/run) start with it.
#   QSTAGE_CMAKE_ARGS="-DQSTAGE_CUDA=OFF" scripts/setup.sh    # extra CMake arguments
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake                        # C++20 compiler and build
  libhdf5-mpi-dev libhdf5-openmpi-dev hdf5-tools   # parallel HDF5 (h5dump for users)
  openmpi-bin libopenmpi-dev                   # MPI ranks, MPI-IO
  libopenblas-openmp-dev                       # CPU backend GEMMs (OpenMP build, see CMakeLists.txt)
  libboost-program-options-dev                 # command line
  libyaml-cpp-dev nlohmann-json3-dev libvalijson-dev   # specs, JSON, JSON Schema
  libspdlog-dev libfmt-dev                     # logging, formatting
  libxxhash-dev                                # content hashes
  libgtest-dev                                 # unit tests
  python3 python3-numpy python3-h5py python3-pytest python3-jsonschema  # end-to-end tests, oracles
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# CUDA is optional: with nvcc in /usr/local/cuda the cuda backend is built too (QSTAGE_CUDA=AUTO).
# shellcheck disable=SC2086
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${QSTAGE_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$(nproc)"
