#!/usr/bin/env python3
"""keys.dedup end to end (the stage, files in and out), in core and out of core, on 1 or more ranks:
items per second, what crossed the host-device bus against a bus rate measured in the same run,
peak device memory against the budget, and the merge's load balance over ranks (seed 004's
Table 1: max/min records per rank and their coefficient of variation).

    python3 bench/dedup_bench.py --rows 200000000 --words 2 --distinct 40000000 \\
        --budgets default,1GiB --ranks 1 --qstage build/qstage --device cuda --pcie-GBps 25 [--ceilings build/bench/qstage_bench] --dir /tmp/kd

With --ceilings (qstage_bench), the bus and the disk are measured first in the same run
(`qstage_bench ceilings --io-dir DIR`: pinned copies each way, HDF5 writes and reads of 4 GiB),
and each run is set against the bound they give: the input must come up the bus and the output
go down it (either way's rate, the two at once), and the disk must read the input file and
write the output file (one after the other):
max(input / h2d, output / d2h, input file / read + output file / write).

With --baseline, each run is repeated with a second binary on the same input (digests of both
outputs printed: they must agree).

Keys are Zipf-like as in `qstage_bench dedup` (a power of a uniform draw picks one of about
`distinct` values; the hottest key is a few percent of the rows), with a float64 value per row.
Prints one JSON object per run on stdout.
"""
import argparse
import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np

from rank_balance import balance


def fmix64(x):
    x = x.copy()
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return x


def write_input(path, rows, words, distinct, seed=1):
    """keys (rows, words) uint64 and values (rows,) float64, written block by block (kept when the
    file there holds this input already)."""
    made = dict(rows=rows, words=words, distinct=distinct, seed=seed)
    if Path(path).exists():
        with h5py.File(path, "r") as f:
            if all(f.attrs.get(k) == v for k, v in made.items()):
                return path
    rng = np.random.default_rng(seed)
    block = 1 << 24
    with h5py.File(path, "w") as f:
        shape = (rows,) if words == 1 else (rows, words)
        chunk = (1 << 20,) if words == 1 else (1 << 20, words)
        k = f.create_dataset("keys", shape=shape, dtype="u8", chunks=chunk)
        v = f.create_dataset("values", shape=(rows,), dtype="f8", chunks=(1 << 20,))
        for at in range(0, rows, block):
            n = min(block, rows - at)
            u = rng.random(n)
            pick = (u ** 3 * distinct).astype(np.uint64)
            cols = [fmix64(pick * np.uint64(4) + np.uint64(w + 1)) for w in range(words)]
            k[at:at + n] = cols[0] if words == 1 else np.stack(cols, axis=1)
            v[at:at + n] = u
        f.attrs.update(made)
    return path


def digest(path):
    """sha256 over the output's datasets (names and bytes), first 16 hex digits."""
    h = hashlib.sha256()
    with h5py.File(path, "r") as f:
        for name in sorted(f.keys()):
            h.update(name.encode())
            h.update(f[name][...].tobytes())
    return h.hexdigest()[:16]


def run_once(a, binary, data, budget, ranks, tag):
    d = Path(a.dir) / f"run-{tag}"
    subprocess.run(["rm", "-rf", str(d)], check=True)
    d.mkdir(parents=True)
    opts = "{}" if budget == "default" else f"{{device_memory: {budget}}}"
    index = "true" if a.index else "false"
    (d / "spec.yaml").write_text(f"""name: dedup-bench
options: {opts}
steps:
  - id: unique
    stage: keys.dedup
    inputs: {{keys: {{file: {data}, dataset: keys}}, values: {{file: {data}, dataset: values}}}}
    params: {{index: {index}}}
""")
    cmd = [binary, "run", str(d / "spec.yaml"), "--run-dir", str(d / "run"), "--device", a.device]
    if ranks > 1:
        # (--bind-to none: OpenMPI binds each rank to one core when -np is 1 or 2)
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", str(ranks)] + cmd
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t
    if p.returncode != 0:
        lines = [l for l in (p.stdout + p.stderr).splitlines() if "pmix" not in l and "dlopen" not in l and "Perhaps" not in l]
        return {"budget": budget, "ranks": ranks, "rc": p.returncode, "error": "\n".join(lines[-12:])}
    m = json.loads((d / "run" / "manifest.json").read_text())["steps"]["unique"]
    metrics = m["metrics"]
    out = d / "run" / m["output"]
    with h5py.File(out, "r") as f:
        load = [int(x) for x in f.attrs["merge_records_per_rank"]]
        unique = f["counts"].shape[0]
    bus = metrics["bytes_to_device"] + metrics["bytes_to_host"]
    resident = re.search(r"on resident data(?:, (records in host memory|in device memory))? in ([0-9.]+) s "
                         r"\(reading and sorting tiles ([0-9.]+) s, of it reading ([0-9.]+) s", p.stderr + p.stdout)
    r = {"binary": binary, "budget": budget, "ranks": ranks, "rows": a.rows, "words": a.words, "unique": unique,
         "wall_seconds": wall, "step_seconds": m["wall_seconds"], "items_per_second": a.rows / wall,  # (the whole process: start, CUDA and files included)
         "bytes_to_device": metrics["bytes_to_device"], "bytes_to_host": metrics["bytes_to_host"],
         "peak_device_bytes": metrics["peak_device_bytes"], "merge_records_per_rank": load,
         "merge_max_over_min": balance(load)["max_over_min"], "merge_cv": balance(load)["cv"],
         "pass_lines": [l[l.find("pass "):][:160] for l in (p.stderr + p.stdout).splitlines() if "to the device and" in l],
         "digest": digest(out)}
    divided = re.search(r"on resident data divided between (\d+) ranks in ([0-9.]+) s \(reading ([0-9.]+) s", p.stderr + p.stdout)
    if divided:  # (the unit divided between the ranks: its seconds, and of them reading this rank's share)
        r["resident_records"] = "device, divided"
        r["resident_seconds"], r["resident_read_seconds"] = float(divided.group(2)), float(divided.group(3))
    if resident:  # (the whole de-duplication as one unit on resident data: its seconds, and of them reading the input)
        r["resident_records"] = "host" if resident.group(1) == "records in host memory" else "device"
        r["resident_seconds"], r["resident_tiles_seconds"], r["resident_read_seconds"] = map(float, resident.groups()[1:])
        host = re.search(r"on the host: tiles down ([0-9.]+) s, spread ([0-9.]+) s; buckets bounded ([0-9.]+) s, gathered "
                         r"([0-9.]+) s, merged ([0-9.]+) s, merges waited for ([0-9.]+) s, spread ([0-9.]+) s",
                         p.stderr + p.stdout)
        if host:  # (the host chain's time, where it went; merged: queueing on cuda, the merges on the cpu)
            r["host_seconds"] = dict(zip(("tiles_down", "tiles_spread", "bounds", "gather", "merge", "merge_wait", "spread"),
                                         map(float, host.groups())))
    if a.pcie_GBps:
        r["bus_bound_seconds"] = bus / (a.pcie_GBps * 1e9)
        r["of_bus_bound"] = r["bus_bound_seconds"] / wall
    if a.rates:
        in_bytes, out_bytes = data.stat().st_size, out.stat().st_size
        c, io = a.rates["copies"], a.rates["hdf5"]
        r["io_bound_seconds"] = max(in_bytes / (c["h2d_GBps"] * 1e9), out_bytes / (c["d2h_GBps"] * 1e9),
                                    in_bytes / (io["read_GBps"] * 1e9) + out_bytes / (io["write_GBps"] * 1e9))
        r["of_io_bound"] = r["io_bound_seconds"] / wall
        r["of_io_bound_step"] = r["io_bound_seconds"] / r["step_seconds"]
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--words", type=int, default=2)
    ap.add_argument("--distinct", type=int, default=0, help="about how many distinct keys (default rows/5)")
    ap.add_argument("--budgets", default="default", help="comma-separated device budgets, e.g. default,1GiB")
    ap.add_argument("--ranks", default="1", help="comma-separated rank counts")
    ap.add_argument("--index", action="store_true", help="also the reverse index")
    ap.add_argument("--qstage", default="qstage")
    ap.add_argument("--baseline", help="a second qstage binary, run after the first on each configuration")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pcie-GBps", type=float, default=0, help="the bus rate (pinned copies, one way) to compare with")
    ap.add_argument("--ceilings", help="qstage_bench: measure the bus and the disk first (see above)")
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    a.rates = None
    if a.ceilings:
        p = subprocess.run([a.ceilings, "ceilings", "--device", a.device, "--m", "1024", "--n", "1024", "--k", "1024",
                            "--io-dir", str(Path(a.dir) / "io"), "--io-bytes", "4GiB"], capture_output=True, text=True, check=True)
        a.rates = json.loads(p.stdout)
        if not a.pcie_GBps:  # (the bus bound's rate: the slower way, as measured)
            a.pcie_GBps = min(a.rates["copies"]["h2d_GBps"], a.rates["copies"]["d2h_GBps"])
        print(json.dumps({"ceilings": {"copies": a.rates["copies"], "hdf5": a.rates["hdf5"]}}), flush=True)
    data = Path(a.dir) / "in.h5"
    t = time.time()
    write_input(data, a.rows, a.words, a.distinct or a.rows // 5)
    print(json.dumps({"input": str(data), "bytes": data.stat().st_size, "write_seconds": time.time() - t}), flush=True)
    for ranks in [int(x) for x in a.ranks.split(",")]:
        for budget in a.budgets.split(","):
            for i, binary in enumerate([a.qstage] + ([a.baseline] if a.baseline else [])):
                print(json.dumps(run_once(a, binary, data, budget, ranks, f"{ranks}-{budget}-{i}")), flush=True)


if __name__ == "__main__":
    main()
