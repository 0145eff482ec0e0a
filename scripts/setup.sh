#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test qstage, then builds it into
# ./build. Both README commands and CI (.ci/run) start with it.
#   QSTAGE_CMAKE_ARGS="-DQSTAGE_CUDA=OFF" scripts/setup.sh    # extra CMake arguments
#   scripts/setup.sh --test-oracles   # also the PyPI test oracles (opt_einsum, cotengra, pyscf, tenpy, stim) in
#                                     # build/oracles, a venv the tests then run with
set -euo pipefail
cd "$(dirname "$0")/.."
oracles=0
for arg in "$@"; do
  case "$arg" in
    --test-oracles) oracles=1 ;;
    *) echo "setup.sh: unknown option '$arg'; expected --test-oracles" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake                        # C++20 compiler and build
  libhdf5-mpi-dev libhdf5-openmpi-dev hdf5-tools   # parallel HDF5 (h5dump for users)
  openmpi-bin libopenmpi-dev                   # MPI ranks, MPI-IO
  libopenblas-openmp-dev                       # CPU backend GEMMs (OpenMP build, see CMakeLists.txt)
  libboost-program-options-dev                 # command line
  libyaml-cpp-dev nlohmann-json3-dev libvalijson-dev   # specs, JSON, JSON Schema
  libspdlog-dev libfmt-dev                     # logging, formatting
  libxxhash-dev                                # content hashes, codec checksums
  libzstd-dev                                  # the codec's lossless parts
  libpng-dev                                   # qstage inspect --plot
  libmetis-dev                                 # tn.path: graph bisection of the network (METIS)
  libtorch-dev                                 # sci.nnqs's network (LibTorch), built as a plugin
  libgtest-dev                                 # unit tests
  python3 python3-numpy python3-h5py python3-pytest python3-jsonschema  # end-to-end tests, oracles
  strace                                       # tests: kills injected at the N-th rename or fsync
)
# the oracles' venv; PyTorch (LibTorch's version) writes TorchScript models for sci.nnqs's tests
[ $oracles -eq 0 ] || packages+=(python3-venv python3-pip python3-torch)
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

# Test oracles from PyPI (never runtime dependencies): a venv that also sees Debian's numpy/h5py.
python_arg=()
if [ $oracles -eq 1 ]; then
  [ -x build/oracles/bin/python ] || /usr/bin/python3 -m venv --system-site-packages build/oracles
  # oracle "WHO NEEDS IT" PACKAGE==VERSION...: installed apart, so one that cannot install leaves the others.
  oracle() {
    local users=$1
    shift
    if ! build/oracles/bin/python -m pip install -q --disable-pip-version-check "$@"; then
      echo "setup.sh: warning: could not install the PyPI test oracles $* (no network?); the tests that" \
           "need $users will say they are skipped" >&2
    fi
  }
  oracle "opt_einsum or cotengra" opt_einsum==3.4.0 cotengra==0.8.3 autoray==0.11.0
  oracle "pyscf (sci.integrals against its FCIDUMP reader and writer)" pyscf==2.14.0
  oracle "tenpy (mps.tebd against TeNPy's TEBDEngine, bench/mps_tebd_bench.py)" physics-tenpy==1.1.1
  oracle "stim (tn.build's detector_error_model against stim's circuit-level models)" stim==1.14.0
  python_arg=(-DQSTAGE_PYTHON="$PWD/build/oracles/bin/python")
fi

# CUDA is optional: with nvcc in /usr/local/cuda the cuda backend is built too (QSTAGE_CUDA=AUTO).
# shellcheck disable=SC2086
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${python_arg[@]}" ${QSTAGE_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$(nproc)"
