#!/usr/bin/env python3
"""sci.solve on 1 or more ranks (one GPU a rank where there are GPUs): the de-duplication of each
iteration's candidates and of the final PT2's, as items per second and the merge's load balance
over ranks (seed 004's Table 1: max/min merged records per rank and their coefficient of
variation), the whole run's seconds, and whether every rank count gives the same bytes.

    python3 bench/sci_ranks_bench.py --fcidump F --params "eps_var: 5.0e-4, eps_pt2: 1.0e-6" \\
        --ranks 4,2,1 --qstage build/qstage --device cuda --dir /tmp/sr

Items per second of a de-duplication are its candidates (duplicates included) over the wall
seconds of its passes (sample, partition, merge; the attribute seconds_<k>_dedup, or
seconds_<k>_pt2_dedup for the final PT2). Prints one JSON object per rank count, then a summary
line saying whether the outputs' datasets are the same bytes for all rank counts.
"""
import argparse
import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np

from rank_balance import balance


def digest(path):
    """sha256 over every dataset's bytes, in name order."""
    h = hashlib.sha256()
    with h5py.File(path, "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for n in sorted(names):
            h.update(n.encode())
            h.update(np.ascontiguousarray(f[n][()]).tobytes())
    return h.hexdigest()


def run_once(a, ranks):
    d = Path(a.dir) / f"ranks-{ranks}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    shutil.copy(a.fcidump, d / "FCIDUMP")
    opts = f"{{device_memory: {a.budget}}}" if a.budget else "{}"
    (d / "spec.yaml").write_text(f"""name: sci-ranks-bench
options: {opts}
steps:
  - id: sci
    stage: sci.solve
    params: {{fcidump: FCIDUMP, {a.params}}}
""")
    cmd = [str(Path(shutil.which(a.qstage) or a.qstage).resolve()), "run", str(d / "spec.yaml"), "--run-dir", str(d / "run"), "--device", a.device]
    if ranks > 1:
        # (--bind-to none: OpenMPI binds each rank to one core when -np is 1 or 2)
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", str(ranks)] + cmd
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=d)
    wall = time.time() - t
    if p.returncode != 0:
        lines = [l for l in (p.stdout + p.stderr).splitlines() if "pmix" not in l and "dlopen" not in l]
        return {"ranks": ranks, "rc": p.returncode, "error": "\n".join(lines[-12:])}, None
    out = d / "run" / "outputs" / "sci.h5"
    r = {"ranks": ranks, "seconds": round(wall, 2), "dedups": []}
    with h5py.File(out, "r") as f:
        at = f.attrs
        r |= {"energy": float(f["energy"][()]), "e_total": float(f["e_total"][()]),
              "dets": int(f["dets"].shape[0]), "peak_device_bytes": [int(x) for x in at["peak_device_bytes"]]}
        phases = {}  # wall seconds per phase, summed over the iterations (pt2_dedup is inside pt2)
        for name, v in at.items():
            parts = name.split("_", 2)
            if parts[0] == "seconds" and len(parts) == 3 and parts[1].isdigit():
                phases[parts[2]] = round(phases.get(parts[2], 0.0) + float(v), 3)
        r["seconds_per_phase"] = phases
        generated = f["iterations/generated"][()]
        for k, g in enumerate(generated):
            if f"merge_records_per_rank_{k}" not in at:
                continue
            s = float(at.get(f"seconds_{k}_dedup", float("nan")))
            r["dedups"].append({"iteration": k, "candidates": int(g), "seconds": round(s, 3),
                                "items_per_second": g / s if s > 0 else None}
                               | balance(at[f"merge_records_per_rank_{k}"]))
        if "pt2_merge_records_per_rank" in at:
            k = len(generated) - 1
            g = int(f["pt2_generated"][()])
            s = float(at.get(f"seconds_{k}_pt2_dedup", float("nan")))
            r["dedups"].append({"iteration": "final PT2", "candidates": g, "seconds": round(s, 3),
                                "items_per_second": g / s if s > 0 else None}
                               | balance(at["pt2_merge_records_per_rank"]))
    return r, digest(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fcidump", required=True, type=Path)
    ap.add_argument("--params", default="eps_var: 5.0e-4, eps_pt2: 1.0e-6, max_new_dets: 1000000",
                    help="sci.solve's parameters besides fcidump, as YAML mapping entries")
    ap.add_argument("--ranks", default="4,2,1", help="comma-separated rank counts, run in this order")
    ap.add_argument("--budget", default="", help="options.device_memory of every rank (default: none)")
    ap.add_argument("--qstage", default="qstage")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dir", default="/tmp/sci-ranks-bench")
    a = ap.parse_args()
    a.fcidump = a.fcidump.resolve()
    digests = {}
    for ranks in [int(x) for x in a.ranks.split(",")]:
        r, dig = run_once(a, ranks)
        print(json.dumps(r), flush=True)
        if dig:
            digests[ranks] = dig
    print(json.dumps({"same_bytes_for_all_rank_counts": len(set(digests.values())) == 1 if digests else None,
                      "digests": digests}))


if __name__ == "__main__":
    main()
