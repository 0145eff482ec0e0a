#!/usr/bin/env python3
"""Selected CI end to end: qstage's sci.solve against PySCF's selected CI (pyscf.fci.selected_ci)
on the same FCIDUMP, as time to reach a target accuracy (1 mHa of a reference energy by default).

Each tool runs with a sequence of thresholds, loosest first; the first run whose energy is within
the target of the reference is the one that counts (its wall time, its determinants). qstage's
energy is E_var (variational, like PySCF's); its E_var + E_PT2 is printed too.

    python3 bench/sci_bench.py --fcidump FILE --reference E --qstage build/qstage --device cuda \\
        [--pyscf-cutoffs 2e-3,1e-3,5e-4,...] [--qstage-eps 1e-3,5e-4,...] [--target 1e-3] [--pyscf-timeout 600]

Prints one JSON object. The reference may come from FCI (small cases) or from a converged run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def pyscf_run(fcidump, cutoff, threads):
    """One PySCF selected-CI run in a subprocess (so a timeout can stop it): energy, seconds, dets."""
    code = f"""
import json, time
from pyscf import lib
lib.num_threads({threads})
from pyscf.tools import fcidump
from pyscf.fci import selected_ci
d = fcidump.read({str(fcidump)!r})
norb, nelec, ms = d['NORB'], d['NELEC'], d.get('MS2', 0)
na, nb = (nelec + ms) // 2, (nelec - ms) // 2
from pyscf import ao2mo
eri = ao2mo.restore(8, d['H2'], norb)
t = time.time()
solver = selected_ci.SCI()
solver.select_cutoff = {cutoff}
solver.ci_coeff_cutoff = {cutoff}
e, civec = solver.kernel(d['H1'], eri, norb, (na, nb), ecore=d['ECORE'])
strs = civec._strs
print(json.dumps({{'energy': float(e), 'seconds': time.time() - t,
                  'dets': int(len(strs[0]) * len(strs[1]))}}))
"""
    return code


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fcidump", required=True)
    ap.add_argument("--reference", type=float, required=True)
    ap.add_argument("--target", type=float, default=1e-3)
    ap.add_argument("--qstage", default="qstage")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--python", default=sys.executable, help="a Python with pyscf")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--pyscf-cutoffs", default="4e-3,2e-3,1e-3,5e-4,2.5e-4,1.2e-4,6e-5,3e-5")
    ap.add_argument("--qstage-eps", default="4e-3,2e-3,1e-3,5e-4,2.5e-4,1.2e-4,6e-5,3e-5")
    ap.add_argument("--qstage-params", default="max_new_dets: 1000000, eps_pt2: 1.0e-7")
    ap.add_argument("--pyscf-timeout", type=float, default=600)
    ap.add_argument("--skip-pyscf", action="store_true")
    a = ap.parse_args()
    fcidump = Path(a.fcidump).resolve()
    out = {"fcidump": str(fcidump), "reference": a.reference, "target": a.target, "pyscf": [], "qstage": []}

    if not a.skip_pyscf:
        for cutoff in [float(x) for x in a.pyscf_cutoffs.split(",")]:
            try:
                p = subprocess.run([a.python, "-c", pyscf_run(fcidump, cutoff, a.threads)], capture_output=True,
                                   text=True, timeout=a.pyscf_timeout)
            except subprocess.TimeoutExpired:
                out["pyscf"].append({"cutoff": cutoff, "timeout": a.pyscf_timeout})
                break
            if p.returncode != 0:
                out["pyscf"].append({"cutoff": cutoff, "error": p.stderr[-2000:]})
                break
            r = json.loads(p.stdout.strip().splitlines()[-1]) | {"cutoff": cutoff}
            r["error_Ha"] = r["energy"] - a.reference
            out["pyscf"].append(r)
            print(json.dumps(r), file=sys.stderr)
            if abs(r["error_Ha"]) < a.target:
                break

    with tempfile.TemporaryDirectory() as tmp:
        for eps in [float(x) for x in a.qstage_eps.split(",")]:
            spec = Path(tmp) / f"sci-{eps}.yaml"
            spec.write_text(f"name: sci\nsteps:\n  - id: sci\n    stage: sci.solve\n    params: {{fcidump: {fcidump}, "
                            f"eps_var: {eps}, {a.qstage_params}}}\n")
            run_dir = Path(tmp) / f"run-{eps}"
            t = time.time()
            p = subprocess.run([a.qstage, "run", str(spec), "--run-dir", str(run_dir), "--device", a.device],
                               capture_output=True, text=True)
            seconds = time.time() - t
            if p.returncode != 0:
                out["qstage"].append({"eps_var": eps, "error": p.stderr[-2000:]})
                break
            import h5py
            with h5py.File(run_dir / "outputs" / "sci.h5") as f:
                r = {"eps_var": eps, "seconds": seconds, "energy": float(f["energy"][()]),
                     "e_total": float(f["e_total"][()]), "dets": int(f["dets"].shape[0]),
                     "iterations": int(f["iterations/e_var"].shape[0]),
                     "peak_device_bytes": int(f.attrs["qstage.peak_device_bytes"])}
            r["error_Ha"] = r["energy"] - a.reference
            r["total_error_Ha"] = r["e_total"] - a.reference
            out["qstage"].append(r)
            print(json.dumps(r), file=sys.stderr)
            if abs(r["error_Ha"]) < a.target:
                break

    def first_within(runs):
        return next((r for r in runs if "error_Ha" in r and abs(r["error_Ha"]) < a.target), None)

    q, s = first_within(out["qstage"]), first_within(out["pyscf"])
    if q and s:
        out["speedup"] = s["seconds"] / q["seconds"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
