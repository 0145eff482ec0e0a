#!/usr/bin/env bash
# Builds Dice (Sharma's SHCI, github sanshar/Dice), the selected-CI peer of bench/sci_dice_bench.py,
# from its public source, for the GPU machine: a benchmark peer, never part of qstage.
#
#   bench/build_dice.sh SOURCE OUT [COMMIT]
#     SOURCE  a git repository of sanshar/Dice (a clone, or the bare mirror `fetch` gives)
#     OUT     where the stripped binary goes (e.g. .gpu/dice/Dice)
#     COMMIT  what to build (default HEAD; the benchmarks used 7816957)
#
# Needs Debian's libboost-mpi-dev, libboost-serialization-dev and libopenmpi-dev (Eigen ships in
# the source). Only the `Dice` target. Its Makefile's paths are given on the command line instead:
# Boost from /usr, no HDF5 or MKL (Dice's SHCI needs neither), -march=x86-64-v3 instead of
# core-avx2 (any AVX2 x86-64), no OpenMPI C++ bindings (Debian has none), and Boost, libstdc++ and
# libgcc linked statically, so that the binary needs only libmpi, libgomp and libc on the GPU
# machine (.gpu/env.sh's OpenMPI). ../shared/notes.md says how to run it.
set -euo pipefail
src=$1 out=$2 commit=${3:-HEAD}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gitdir=$(git -C "$src" rev-parse --absolute-git-dir)
# (only what the Dice target compiles: a mirror may lack the large files of the other programs)
git --git-dir "$gitdir" archive "$commit" Makefile SHCI eigen | tar -x -C "$work"
hash=$(git --git-dir "$gitdir" rev-parse "$commit")
mkdir -p "$work/obj/SHCI" "$work/bin"
make -C "$work" -j"$(nproc)" Dice CXX=mpicxx BOOST=/usr HDF5= MKL= \
  FLAGS_BASE="-std=c++14 -O3 -w -fPIC -I. -I./eigen/ -march=x86-64-v3 -fopenmp -fpermissive -DOMPI_SKIP_MPICXX=1" \
  LFLAGS_BASE=-lrt \
  LFLAGS_SHCI="-lrt -Wl,-Bstatic -lboost_mpi -lboost_serialization -Wl,-Bdynamic -static-libstdc++ -static-libgcc" \
  VERSION_FLAGS="-DGIT_HASH=\"\\\"$hash\\\"\" -DCOMPILE_TIME=\"\\\"$(date -u +%F)\\\"\" -DGIT_BRANCH=\"\\\"master\\\"\""
mkdir -p "$(dirname "$out")"
strip -o "$out" "$work/bin/Dice"
echo "Dice $hash -> $out ($(stat -c %s "$out") bytes)"
