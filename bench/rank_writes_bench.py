#!/usr/bin/env python3
"""What writing rows costs on several ranks: a workflow whose steps write large `rows` outputs
(workflows/streaming-matmul.yaml: tensor.random, tensor.matmul, tensor.stats, 512 MiB each), run
on each rank count with a commit after every round and with a longer interval, by one or two
qstage binaries taken in turn (A B A B ...) so that both see the same machine. Prints one JSON
line per (binary, ranks, interval) with the median, min and max wall seconds of the whole run,
then whether every run's datasets are the same bytes (all runs, and each binary's own; the rank
counts differ in threads per rank).

    python3 bench/rank_writes_bench.py --qstage build/qstage --baseline /tmp/old/qstage \\
        --ranks 2,1 --repeat 5 --dir /tmp/rwb
"""
import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from sci_ranks_bench import digest


def run_digest(run_dir):
    """sha256 over every output file's dataset digest, in file name order."""
    h = hashlib.sha256()
    for path in sorted((run_dir / "outputs").glob("*.h5")):
        h.update(f"{path.name}:{digest(path)}".encode())
    return h.hexdigest()


def run_once(qstage, ranks, spec, interval, run_dir, device):
    """The whole run's wall seconds. Each rank gets an equal share of the cores (OMP_NUM_THREADS)
    and no binding (OpenMPI binds each of 2 ranks to one core by default)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [qstage, "run", str(spec), "--run-dir", str(run_dir), "--device", device, "--checkpoint-interval", interval]
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // ranks)))
    start = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qstage", default="qstage")
    ap.add_argument("--baseline", default="", help="a second qstage binary, run in turn with the first")
    ap.add_argument("--ranks", default="2,1", help="comma-separated rank counts")
    ap.add_argument("--intervals", default="0,120s", help="checkpoint intervals (0: after every round)")
    ap.add_argument("--workflow", type=Path, default=Path(__file__).resolve().parent.parent / "workflows" / "streaming-matmul.yaml")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/rank-writes-bench"))
    args = ap.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    binaries = {"qstage": args.qstage}
    if args.baseline:
        binaries["baseline"] = args.baseline
    args.dir.mkdir(parents=True, exist_ok=True)
    digests = {}
    for ranks in [int(r) for r in args.ranks.split(",")]:
        for interval in args.intervals.split(","):
            seconds = {name: [] for name in binaries}
            for _ in range(args.repeat):
                for name, binary in binaries.items():
                    run_dir = args.dir / f"{name}-r{ranks}-i{interval}"
                    seconds[name].append(run_once(binary, ranks, args.workflow, interval, run_dir, args.device))
            for name in binaries:
                run_dir = args.dir / f"{name}-r{ranks}-i{interval}"
                digests[f"{name} ranks={ranks} interval={interval}"] = run_digest(run_dir)
                s = seconds[name]
                print(json.dumps({"binary": name, "ranks": ranks, "checkpoint_interval": interval,
                                  "median_s": round(statistics.median(s), 3), "min_s": round(min(s), 3),
                                  "max_s": round(max(s), 3)}), flush=True)
    same = {name: len({d for k, d in digests.items() if k.startswith(name + " ")}) == 1 for name in binaries}
    print(json.dumps({"same_bytes_for_all_runs": len(set(digests.values())) == 1,
                      "same_bytes_for_all_runs_of": same, "digests": digests}))


if __name__ == "__main__":
    main()
