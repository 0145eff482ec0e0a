#!/usr/bin/env bash
# Runs qstage's GPU tests and benchmarks on a lent GPU machine, from the checkout root, after
# ../shared/gpu/pack.sh libopenblas0-openmp and a build installed into .gpu/install
# (docs/benchmarks.md, "How to reproduce").
#   (pack: ../shared/gpu/pack.sh libopenblas0-openmp libspdlog1.10 libfmt9 libxxhash0 libquadmath0 libpng16-16 libmetis5)
#   bash bench/gpu_run.sh tests [PYTEST ARGS]   unit tests (GPU kernels included) and the pytest suite on cuda
#   bash bench/gpu_run.sh bench ARGS   bench/matmul_bench.py with ARGS
#   bash bench/gpu_run.sh tn ARGS      bench/tn_bench.py with ARGS
#   bash bench/gpu_run.sh compute ARGS bench/compute_bench.py with ARGS (compute modes; --torch for the peer)
#   bash bench/gpu_run.sh codec ARGS   bench/codec_bench.py with ARGS (peers: hdf5plugin's SZ3 and ZFP
#                                      plugins and zstandard for Python 3.12, unpacked into .gpu/py)
# The PyPI test oracles (opt_einsum, cotengra, autoray) travel unpacked in .gpu/py:
#   pip download --no-deps -d W opt_einsum==3.4.0 cotengra==0.8.3 autoray==0.11.0, unzip each into .gpu/py
#   bash bench/gpu_run.sh compress ARGS  bench/compress_bench.py with ARGS (the compression stages end to end)
#   bash bench/gpu_run.sh nnqs ARGS    sci.nnqs's network plugin built against this machine's CUDA torch,
#                                      its check (qstage_nnqs_model_check), then bench/nnqs_bench.py with ARGS,
#                                      e.g. --fcidump F --params "max_iterations: 6, steps: 100, fit_steps: 800"
#   bash bench/gpu_run.sh probe        device facts and I/O ceilings only
set -uo pipefail
source .gpu/env.sh
# qstage links the OpenMP build of OpenBLAS; env.sh puts the pthread build first on the path.
export LD_LIBRARY_PATH=/tmp/qdeps/usr/lib/x86_64-linux-gnu/openblas-openmp:$LD_LIBRARY_PATH
export PATH=$PWD/.gpu/install/bin:$PATH
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export PYTHONPATH=$PWD/.gpu/py${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/qstage-out}
mkdir -p "$OUT"

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
qstage --version
case "${1:-}" in
  tests)
    qstage_unit_tests --gtest_brief=1 2>&1 | tail -n 30
    # (sci.nnqs's tests run where `gpu_run.sh nnqs` built the network plugin)
    [ -f /tmp/build-nnqs/libqstage_nnqs.so ] && export QSTAGE_NNQS_PLUGIN=/tmp/build-nnqs/libqstage_nnqs.so
    per_test=""
    python3 -c "import pytest_timeout" 2>/dev/null && per_test="--timeout 150"
    shift
    selection=("$@")
    [ ${#selection[@]} -gt 0 ] || selection=(tests/python)
    QSTAGE_BIN=$(command -v qstage) QSTAGE_TEST_DEVICE=cuda QSTAGE_H5Z_DIR=$PWD/.gpu/install/lib/qstage/hdf5-plugin \
      python3 -m pytest -q -rs -p no:cacheprovider \
      $per_test "${selection[@]}" > "$OUT/pytest.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -n 20
    ;;
  bench)
    shift
    python3 bench/matmul_bench.py --qstage "$(command -v qstage)" --bench "$(command -v qstage_bench)" "$@"
    ;;
  tn)
    shift
    python3 bench/tn_bench.py --qstage "$(command -v qstage)" --bench "$(command -v qstage_bench)" "$@"
    ;;
  compute)
    shift
    python3 bench/compute_bench.py --qstage "$(command -v qstage)" --bench "$(command -v qstage_bench)" "$@"
    ;;
  codec)
    shift
    python3 bench/codec_bench.py --qstage "$(command -v qstage)" --bench "$(command -v qstage_bench)" \
      --plugin "$PWD/.gpu/install/lib/qstage/hdf5-plugin" "$@"
    ;;
  compress)
    shift
    python3 bench/compress_bench.py --qstage "$(command -v qstage)" "$@"
    ;;
  cutn)
    # cuTensorNet against qstage (bench/cutn_bench.py; its docstring says how the wheels and the
    # parts of libcutensor.so.2 get to /tmp/cutn and .whl/cutn/base).
    shift
    site=/tmp/cutn-site
    base=.whl/cutn/base
    [ -d $base ] || base=/tmp/cutn/base   # sent ahead like the parts when .gpu leaves no room for it
    if [ ! -s $site/cutensor/lib/libcutensor.so.2 ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site \
        $base/wheels/*.whl || { echo "cutn: installing $base/wheels failed" >&2; exit 3; }
      mkdir -p $site/cutensor/lib
      ls /tmp/cutn/libcutensor.so.2.xz.part* >/dev/null || { echo "cutn: no /tmp/cutn/libcutensor.so.2.xz.part*; send the parts first" >&2; exit 3; }
      cat /tmp/cutn/libcutensor.so.2.xz.part* | xz -d > $site/cutensor/lib/libcutensor.so.2.tmp &&
        (cd $site/cutensor/lib && mv libcutensor.so.2.tmp libcutensor.so.2 &&
         sha256sum -c "$(cd "$OLDPWD" && realpath $base/libcutensor.so.2.sha256)") ||
        { echo "cutn: libcutensor.so.2 did not unpack or its sha256 differs" >&2; rm -f $site/cutensor/lib/libcutensor.so.2*; exit 3; }
    fi
    nvlib=$(python3 -c "import os, sys; print(next((os.path.join(p, 'nvidia', 'cu13', 'lib') for p in sys.path if os.path.isdir(os.path.join(p, 'nvidia', 'cu13', 'lib'))), ''))")
    export PYTHONPATH=$site:$PYTHONPATH
    export LD_LIBRARY_PATH=$site/cuquantum/lib:$site/cutensor/lib${nvlib:+:$nvlib}:$LD_LIBRARY_PATH
    python3 bench/cutn_bench.py run --qstage "$(command -v qstage)" --bench "$(command -v qstage_bench)" "$@"
    ;;
  nnqs)
    # (PyTorch's own libraries, not the packed ones: the plugin is built and checked, and the eager
    # peer runs, without LD_LIBRARY_PATH; qstage loads the plugin, which finds torch by its rpath)
    shift
    clean=(env -u LD_LIBRARY_PATH)
    torch_cmake=$("${clean[@]}" python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
    { "${clean[@]}" cmake -S stages/nnqs/model -B /tmp/build-nnqs -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$torch_cmake" -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc && "${clean[@]}" cmake --build /tmp/build-nnqs -j; } > "$OUT/nnqs_build.log" 2>&1 ||
      { tail -n 20 "$OUT/nnqs_build.log"; echo "nnqs: the plugin did not build (log: $OUT/nnqs_build.log)" >&2; exit 3; }
    "${clean[@]}" /tmp/build-nnqs/qstage_nnqs_model_check | tail -n 4
    export QSTAGE_NNQS_PLUGIN=/tmp/build-nnqs/libqstage_nnqs.so
    printf '#!/bin/sh\nexec env -u LD_LIBRARY_PATH python3 "$@"\n' > /tmp/python-without-packed-libraries
    chmod +x /tmp/python-without-packed-libraries
    python3 bench/nnqs_bench.py --qstage "$(command -v qstage)" --python /tmp/python-without-packed-libraries "$@"
    ;;
  probe)
    for dir in /dev/shm/qprobe /tmp/qprobe; do
      qstage_bench ceilings --device cuda --m 4096 --n 16384 --k 16384 --io-dir $dir --io-bytes 8GiB
    done
    df -h /tmp /dev/shm | cat
    free -g | cat
    ;;
  *) echo "usage: bash bench/gpu_run.sh tests|bench ARGS|tn ARGS|compute ARGS|codec ARGS|compress ARGS|cutn ARGS|nnqs ARGS|probe" >&2; exit 2 ;;
esac
