#!/usr/bin/env python3
"""sci.solve against Dice (Sharma's SHCI, github sanshar/Dice), the selected-CI code chemists
use, on the same FCIDUMP, thresholds and state, one after the other on the same machine.

    python3 bench/sci_dice_bench.py --fcidump FILE --eps-var 2e-4 [--eps-pt2 1e-6] \\
        [--eps-pt2-large 1e-5 --pt2-samples 200 --pt2-target-error 1e-5] [--repeat 3 --baseline OTHER_QSTAGE] \\
        --qstage build/qstage --device cuda --dice /path/to/Dice --dice-ranks 16 [--irrep 1] [--nroots 3] [--dir /tmp/sd]

Ranks against one rank in one run, without --dice: `--ranks 2 --baseline build/qstage --baseline-ranks 1`
(each rank OMP_NUM_THREADS threads; the final PT2's seconds are reported beside the walls).

qstage runs first; Dice then starts from qstage's reference determinant (the output's
`reference_determinant`: the same irrep and S_z, as Dice's `nocc` line fixes them), with
`schedule 0 eps_var`, `davidsonTol 1e-5`, `dE 1e-6` and, with --eps-pt2, deterministic
Epstein-Nesbet PT2 at `epsilon2 eps_pt2` (qstage's final PT2 is deterministic too). Without
--eps-pt2 neither runs a PT2. With --eps-pt2-large both run semistochastic PT2s: deterministic at
eps_pt2_large, stochastic at eps_pt2, until the error bar is below --pt2-target-error. qstage draws
--pt2-samples determinants a batch and looks at its error bar after each group of batches (10,
then as many as the spread so far says are still needed, 2 at least); Dice draws sampleN
on each rank (sampleN = pt2_samples / ranks, so about as many a batch) and looks after every batch
from the fifth. Dice gets the FCIDUMP with a one-line `&FCI NORB=..,NELEC=..,MS2=..,`
header, the only form its reader takes. Dice is a benchmark peer, never part of qstage: build it
with bench/build_dice.sh.

--eps-var may be a decreasing list (`1e-3,7e-4,5e-4`): qstage runs it as one schedule (PT2 at each
threshold, E_var against E_PT2 extrapolated to E_PT2 = 0); Dice runs each threshold on its own
from the reference (deterministic PT2 each), and the same least-squares line through its points
gives its extrapolated energy. Dice's wall is then the sum of its runs; its last run's is reported
too.

--nroots k asks both for the k lowest states (Dice's `nroots`); each root's E_var and E_var + E_PT2
are reported (`roots_e_var`, `roots_e_total`), the scalars stay the lowest root's.

Prints one JSON object: each tool's wall seconds (the whole process), E_var, E_var + E_PT2 and
determinants (Dice's from its log, with its git commit and the input it was given), the ratio of
the wall times, and the energy differences.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import h5py


def one_line_header(src, dst):
    """The FCIDUMP with its namelist rewritten as Dice reads it."""
    text = Path(src).read_text()
    end = re.search(r"(&END|/|\$END)", text, re.IGNORECASE)
    header, body = text[:end.start()], text[end.end():]
    values = {}
    for key in ("NORB", "NELEC", "MS2", "ISYM"):
        m = re.search(rf"\b{key}\s*=\s*(-?\d+)", header, re.IGNORECASE)
        if m:
            values[key] = int(m.group(1))
    orbsym = re.search(r"ORBSYM\s*=\s*([\d,\s]+)", header, re.IGNORECASE)
    labels = [x for x in re.split(r"[,\s]+", orbsym.group(1)) if x] if orbsym else ["1"] * values["NORB"]
    head = f"&FCI NORB={values['NORB']},NELEC={values['NELEC']},MS2={values.get('MS2', 0)},\n"
    head += " ORBSYM=" + ",".join(labels) + ",\n" + f" ISYM={values.get('ISYM', 1)},\n&END\n"
    Path(dst).write_text(head + body.lstrip("\n"))
    return values


def spin_orbitals(described):
    """qstage's "alpha 0-5, 7; beta 0-5" as Dice's occupied spin orbitals (2p alpha, 2p + 1 beta)."""
    out = []
    for part in described.split(";"):
        spin, _, orbitals = part.strip().partition(" ")
        for item in orbitals.split(","):
            item = item.strip()
            if not item or item == "none":
                continue
            lo, _, hi = item.partition("-")
            for p in range(int(lo), int(hi or lo) + 1):
                out.append(2 * p + (spin == "beta"))
    return sorted(out)


def extrapolated(e_var, e_pt2):
    """E_var against E_PT2, a least-squares line, at E_PT2 = 0 (as sci.solve fits its schedule)."""
    n = len(e_var)
    mx, my = sum(e_pt2) / n, sum(e_var) / n
    sxx = sum((x - mx) ** 2 for x in e_pt2)
    slope = sum((x - mx) * (y - my) for x, y in zip(e_pt2, e_var)) / sxx
    return my - slope * mx, slope


def run_qstage(a, d, binary=None, run_dir="qstage", ranks=None):
    eps_var = a.eps_var[0] if len(a.eps_var) == 1 else "[" + ", ".join(map(str, a.eps_var)) + "]"
    params = f"fcidump: {Path(a.fcidump).resolve()}, eps_var: {eps_var}, max_new_dets: {a.max_new_dets}"
    params += f", eps_pt2: {a.eps_pt2 if a.eps_pt2 else a.eps_var[-1]}"
    if a.eps_pt2_large:
        params += (f", eps_pt2_large: {a.eps_pt2_large}, pt2_samples: {a.pt2_samples}, "
                   f"pt2_target_error: {a.pt2_target_error}, pt2_batches: {a.pt2_batches}")
    if a.irrep:
        params += f", irrep: {a.irrep}"
    if a.nroots > 1:
        params += f", nroots: {a.nroots}"
    (d / "sci.yaml").write_text(f"name: sci-dice-bench\nsteps:\n  - id: sci\n    stage: sci.solve\n    params: {{{params}}}\n")
    t = time.time()
    subprocess.run(["rm", "-rf", str(d / run_dir)], check=True)
    budget = ["--device-memory", a.device_memory] if a.device_memory else []
    ranks = ranks or a.ranks
    mpi = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", str(ranks), "-x", "OMP_NUM_THREADS"] if ranks > 1 else []
    p = subprocess.run(mpi + [binary or a.qstage, "run", str(d / "sci.yaml"), "--run-dir", str(d / run_dir), "--device", a.device]
                       + budget, capture_output=True, text=True)
    wall = time.time() - t
    if p.returncode:
        raise SystemExit(f"qstage failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    with h5py.File(d / run_dir / "outputs" / "sci.h5") as f:
        digest = hashlib.sha256()  # (the space, its coefficients and the energies: the bytes a user reads)
        for name in ("dets", "coefficients", "energy", "e_total"):
            digest.update(f[name][()].tobytes())
        davidson = sum(float(v) for k, v in f.attrs.items() if k.startswith("seconds_") and k.endswith("_davidson"))
        pt2 = sum(float(v) for k, v in f.attrs.items() if k.startswith("seconds_") and k.endswith("_pt2"))  # (the final PT2)
        schedule = {}
        if "schedule" in f:
            schedule = {k: f["schedule"][k][()].tolist() for k in ("eps_var", "e_var", "e_pt2", "dets")}
        if "e_extrapolated" in f.attrs:
            schedule["e_extrapolated"] = float(f.attrs["e_extrapolated"])
        roots = {}
        if "roots" in f:
            roots = {"roots_e_var": f["roots/energy"][()].tolist(), "roots_e_total": f["roots/e_total"][()].tolist(),
                     "roots_s_squared": f["roots/s_squared"][()].tolist()}
        return roots | {"schedule": schedule, "wall_seconds": wall, "e_var": float(f["energy"][()]), "e_total": float(f["e_total"][()]),
                "e_pt2_error": float(f["e_pt2_error"][()]) if "e_pt2_error" in f else 0.0,
                "pt2_batches": len(f["pt2_stochastic/batch_e_pt2"]) if "pt2_stochastic" in f else 0,
                "dets": int(f["dets"].shape[0]), "step_seconds": float(f.attrs["qstage.wall_seconds"]),
                "davidson_seconds": davidson, "pt2_seconds": pt2, "ranks": ranks, "digest": digest.hexdigest()[:16],
                "irrep": int(f.attrs["irrep"]), "s_squared": float(f.attrs["s_squared"]),
                "reference": f.attrs["reference_determinant"]}


def run_dice(a, d, reference):
    if len(a.eps_var) == 1:
        return run_dice_at(a, a.eps_var[0], d / "dice", reference)
    runs = [run_dice_at(a, eps, d / f"dice-{eps}", reference) for eps in a.eps_var]
    out = dict(runs[-1])
    out["last_wall_seconds"] = runs[-1]["wall_seconds"]
    out["wall_seconds"] = sum(r["wall_seconds"] for r in runs)
    e_var = [r["e_var"] for r in runs]
    e_pt2 = [r["e_total"] - r["e_var"] for r in runs]
    out["schedule"] = {"eps_var": a.eps_var, "e_var": e_var, "e_pt2": e_pt2, "dets": [r["dets"] for r in runs],
                       "wall_seconds": [r["wall_seconds"] for r in runs]}
    if a.eps_pt2 and all(r["e_total"] is not None and r["e_var"] is not None for r in runs):
        out["schedule"]["e_extrapolated"] = extrapolated(e_var, e_pt2)[0]
    return out


def run_dice_at(a, eps_var, work, reference):
    work.mkdir(exist_ok=True)
    one_line_header(a.fcidump, work / "FCIDUMP")
    occ = spin_orbitals(reference)
    if a.eps_pt2 and a.eps_pt2_large:
        pt = (f"epsilon2 {a.eps_pt2}\nepsilon2Large {a.eps_pt2_large}\n"
              f"sampleN {max(1, a.pt2_samples // a.dice_ranks)}\ntargetError {a.pt2_target_error}\nseed 1\n")
    elif a.eps_pt2:
        pt = f"deterministic\nepsilon2 {a.eps_pt2}\n"
    else:
        pt = "#no PT: stochastic PT with nPTiter 0 is skipped\nsampleN 200\nnPTiter 0\n"
    (work / "input.dat").write_text(
        f"#system\nnocc {len(occ)}\n{' '.join(map(str, occ))}\nend\norbitals FCIDUMP\nnroots {a.nroots}\n\n"
        f"#variational\nschedule\n0 {eps_var}\nend\ndavidsonTol 1e-5\ndE 1e-6\nmaxiter {a.max_iterations}\nnoio\n\n"
        f"#pt\n{pt}")
    for shm in Path("/dev/shm").glob("SHCI*"):  # (its ranks' shared segments: a crashed run leaves them)
        shm.unlink()
    cmd = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", str(a.dice_ranks), os.path.abspath(a.dice), "input.dat"]  # (Dice runs in its own folder)
    t = time.time()
    timed_out = False
    with open(work / "dice.log", "w") as out:
        p = subprocess.Popen(cmd, cwd=work, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            p.wait(timeout=a.dice_timeout)
        except subprocess.TimeoutExpired:  # (a semistochastic PT2 far from its target: its last average)
            os.killpg(p.pid, 9)
            p.wait()
            timed_out = True
    wall = time.time() - t
    log = (work / "dice.log").read_text()
    if p.returncode and not timed_out:
        raise SystemExit(f"Dice failed (exit {p.returncode}):\n{log[-2000:]}")
    e_var = None
    after = log.split("Variational calculation result", 1)[-1]
    m = re.search(r"^\s*0\s+(-?\d+\.\d+)", after, re.MULTILINE)
    if m:
        e_var = float(m.group(1))
    # (the last: a semistochastic PT2 prints its deterministic part's first)
    pt = ([None] + list(re.finditer(r"PTEnergy:\s+(-?\d+\.\d+)(?:\s*\+/-\s*([\d.eE+-]+))?", log)))[-1]
    dets = re.findall(r"^\s*\d+\s+\d+\s+[-\d.eE]+\s+(\d+)\s+", log, re.MULTILINE)  # (the iteration table's column)
    # The semistochastic table's rows: iteration, this batch's, root, the average, its error, seconds.
    rows = re.findall(r"^\s*(\d+)\s+(-?\d+\.\d+)\s+0\s+(-?\d+\.\d+)\s+([\d.eE+-]+|--)\s+([\d.]+)\s*$", log, re.MULTILINE)
    e_total, error = (float(pt.group(1)), float(pt.group(2)) if pt.group(2) else 0.0) if pt else (e_var, 0.0)
    if timed_out and rows:
        e_total, error = float(rows[-1][2]), float(rows[-1][3]) if rows[-1][3] != "--" else float("nan")
    commit = re.search(r"^Commit:\s+(\S+)", log, re.MULTILINE)
    roots = {}
    if a.nroots > 1:  # (its variational table's rows, then a PTEnergy line a root: the last nroots)
        table = re.findall(r"^\s*(\d+)\s+(-?\d+\.\d+)\s+[\d.]+\s*$", after.split("Printing", 1)[0], re.MULTILINE)
        pts = re.findall(r"PTEnergy:\s+(-?\d+\.\d+)", log)
        roots = {"roots_e_var": [float(e) for _, e in table[:a.nroots]],
                 "roots_e_total": [float(e) for e in pts[-a.nroots:]] if a.eps_pt2 else [float(e) for _, e in table[:a.nroots]]}
        e_total = roots["roots_e_total"][0] if roots["roots_e_total"] else e_total  # (the lowest root's, as qstage's)
    return roots | {"wall_seconds": wall, "e_var": e_var, "e_total": e_total, "e_pt2_error": error, "timed_out": timed_out,
            "commit": commit.group(1) if commit else None, "input": (work / "input.dat").read_text(),
            "pt2_batches": len(rows),
            "dets": int(dets[-1]) if dets else None, "occupation": occ, "ranks": a.dice_ranks}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fcidump", required=True)
    p.add_argument("--eps-var", type=lambda v: [float(x) for x in v.split(",")], default=[2e-4],
                   help="a threshold, or a decreasing comma-separated schedule (1e-3,7e-4,5e-4)")
    p.add_argument("--eps-pt2", type=float, default=None, help="deterministic EN-PT2 threshold (none: no PT2)")
    p.add_argument("--eps-pt2-large", type=float, default=None,
                   help="semistochastic PT2: its deterministic threshold (eps_pt2 is the stochastic one)")
    p.add_argument("--pt2-samples", type=int, default=200, help="semistochastic PT2: draws a batch")
    p.add_argument("--pt2-target-error", type=float, default=1e-5, help="semistochastic PT2: the error bar to stop at (Ha)")
    p.add_argument("--pt2-batches", type=int, default=1000, help="semistochastic PT2: qstage's most batches")
    p.add_argument("--max-new-dets", type=int, default=1000000)
    p.add_argument("--max-iterations", type=int, default=20)
    p.add_argument("--irrep", type=int, default=None, help="the state's irrep (default: the FCIDUMP's ISYM)")
    p.add_argument("--nroots", type=int, default=1, help="the lowest states to find (both tools)")
    p.add_argument("--qstage", default="build/qstage")
    p.add_argument("--device", default="cuda")
    p.add_argument("--device-memory", help="qstage's --device-memory (on the CPU backend the memory a run may keep its data "
                   "in; its default, a quarter of RAM, sends a large molecule's semistochastic groups through files)")
    p.add_argument("--dice", default=None, help="the Dice binary (bench/build_dice.sh); none: qstage alone")
    p.add_argument("--dice-ranks", type=int, default=os.cpu_count())
    p.add_argument("--dice-timeout", type=float, default=None,
                   help="seconds Dice may run; then its last semistochastic average and error bar are reported")
    p.add_argument("--dir", default="/tmp/sci-dice-bench")
    p.add_argument("--repeat", type=int, default=1, help="qstage's runs (its first is reported, every wall listed)")
    p.add_argument("--baseline", default=None,
                   help="another qstage build (or the same on --baseline-ranks), run alternately with --qstage: walls, "
                        "Davidson and final-PT2 seconds and whether its outputs are the same bytes")
    p.add_argument("--ranks", type=int, default=1, help="qstage's MPI ranks (mpirun -np; each rank OMP_NUM_THREADS threads)")
    p.add_argument("--baseline-ranks", type=int, default=None, help="the baseline's ranks (default: --ranks)")
    a = p.parse_args()
    d = Path(a.dir)
    subprocess.run(["rm", "-rf", str(d)], check=True)
    d.mkdir(parents=True)
    out = {"fcidump": str(a.fcidump), "eps_var": a.eps_var, "eps_pt2": a.eps_pt2, "eps_pt2_large": a.eps_pt2_large,
           "pt2_samples": a.pt2_samples, "pt2_target_error": a.pt2_target_error, "device": a.device, "device_memory": a.device_memory,
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "qstage": run_qstage(a, d)}
    runs, baseline = [out["qstage"]], []
    for k in range(a.repeat):
        if a.baseline:
            baseline.append(run_qstage(a, d, a.baseline, "baseline", a.baseline_ranks))
        if k + 1 < a.repeat:
            runs.append(run_qstage(a, d))
    timed = ("wall_seconds", "davidson_seconds", "pt2_seconds")
    out["qstage"]["runs"] = [{k: r[k] for k in timed} for r in runs]
    if baseline:
        out["baseline"] = {"qstage": a.baseline, "ranks": baseline[0]["ranks"],
                           "same_bytes": all(b["digest"] == runs[0]["digest"] for b in baseline + runs),
                           "runs": [{k: r[k] for k in timed} for r in baseline]}
    if a.dice:
        out["dice"] = run_dice(a, d, out["qstage"]["reference"])
        q, x = out["qstage"], out["dice"]
        out["dice_over_qstage_wall"] = x["wall_seconds"] / q["wall_seconds"]
        if x["e_var"] is not None:
            out["e_var_difference_mha"] = 1e3 * (q["e_var"] - x["e_var"])
        if x["e_total"] is not None:
            out["e_total_difference_mha"] = 1e3 * (q["e_total"] - x["e_total"])
        if "roots_e_total" in q and len(x.get("roots_e_total", [])) == len(q["roots_e_total"]):
            out["roots_e_total_difference_mha"] = [1e3 * (u - v) for u, v in zip(q["roots_e_total"], x["roots_e_total"])]
        if "e_extrapolated" in q["schedule"] and "e_extrapolated" in x.get("schedule", {}):
            out["e_extrapolated_difference_mha"] = 1e3 * (q["schedule"]["e_extrapolated"] - x["schedule"]["e_extrapolated"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
