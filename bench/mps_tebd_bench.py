#!/usr/bin/env python3
"""mps.tebd against TeNPy's TEBDEngine (charge-conserving), issue 19's benchmark: an XXZ Neel quench,
seconds per Trotter step at saturated bond dimension, the same truncation in both.

    python3 bench/mps_tebd_bench.py --L 100 --dt 0.05 --order 2 --chi 1024,2048,4096 \\
        --warm-steps 120 --steps 3 --qstage build/qstage --device cuda --threads 16 --dir /tmp/mps-bench

Per chi_max, one qstage workflow: mps.init (Neel), `warm` (--warm-steps steps: chi grows from 1 to
chi_max), and from warm's state two timed steps, `one` (1 step) and `more` (1 + --steps steps). The
per-step figure is (wall(more) - wall(one)) / steps, wall the manifest's `wall_seconds` of a step
(the stage's compute(): reading the state, the evolution, the t = 0 and final measurements; not
writing the file): all but the --steps extra steps cancel. TeNPy starts from the same warmed state
(qstage's file, charges and all, into TeNPy's MPS: only the timed phase is TeNPy's work), takes one
untimed step, then --steps steps, each timed alone; its figure is their median. Both evolve the
same state through the same 1 + --steps steps of the same circuit (at order 2 gate for gate,
truncation for truncation), so the truncation errors of that phase and the final densities are
reported side by side as a check that the two did the same work. TeNPy never starts a run from a
product state here: its warm-up at chi 4096 would take hours and time nothing we report.

Where both do not fit one time limit (chi 4096 on a GPU machine lent 10 minutes a call): qstage
with --no-tenpy, then TeNPy with --tenpy-only (it makes or reuses qstage's `warm` state in --dir
and times TeNPy alone; --untimed-steps 0 --steps 1 times its first step), the ratio taken by hand.

Out of core: --budget-fractions 0.25 also runs qstage's timed steps from the same `warm` state (a
copy of its run directory) with --device-memory that fraction of the state's values
(complex128 bytes), after the in-core run on the same machine, and reports each fraction's
seconds per step against the in-core figure (the fraction of the in-core rate), whether its `more`
state has the in-core bytes, and the log's line on how the updates shared the budget and went in groups:

    python3 bench/mps_tebd_bench.py --L 100 --chi 4096 --start random --steps 1 --no-tenpy \
        --budget-fractions 0.25 --qstage build/qstage --device cuda --threads 16 --dir /tmp/mps-bench

Threads: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS (and the rest below) are set to
--threads before numpy is imported, for TeNPy (its SVDs and GEMMs are numpy/scipy's LAPACK and
BLAS), and for qstage's OpenMP. Without tenpy (PyPI physics-tenpy) it says so and times qstage
alone. Prints a Markdown table and one JSON object per chi_max (and all of them to --json).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--L", type=int, default=100)
    p.add_argument("--chi", default="1024,2048,4096", help="chi_max values, comma separated")
    p.add_argument("--dt", type=float, default=0.05)
    p.add_argument("--order", type=int, default=2, choices=(2, 4))
    p.add_argument("--J", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=0.5)
    p.add_argument("--svd-min", type=float, default=1e-10)
    p.add_argument("--trunc-cut", type=float, default=1e-14)
    p.add_argument("--warm-steps", type=int, default=120, help="steps before the timed ones (chi should reach chi_max)")
    p.add_argument("--start", default="neel", choices=("neel", "random"),
                   help="neel: warm up from the Neel state; random: start from mps.init's seeded random state "
                        "with every bond at chi_max (no warm-up; every bond saturated, a heavier step than a quench's)")
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--untimed-steps", type=int, default=1,
                   help="TeNPy's steps before the timed ones (0: time its first step; at chi 4096 a step takes minutes)")
    p.add_argument("--tenpy-only", action="store_true",
                   help="time TeNPy alone, from qstage's `warm` state (made in --dir, or kept from an earlier run there): "
                        "qstage (--no-tenpy) and TeNPy in separate runs when both do not fit one time limit")
    p.add_argument("--qstage", default="build/qstage")
    p.add_argument("--device", default="cpu", help="qstage's --device (cpu or cuda)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--dir", default="/tmp/mps-tebd-bench")
    p.add_argument("--json", default=None, help="also write all rows to this file")
    p.add_argument("--no-tenpy", action="store_true", help="time qstage alone")
    p.add_argument("--budget-fractions", default="",
                   help="comma-separated fractions of the warm state's values: the timed steps again within that "
                        "device budget (e.g. 0.25), against the in-core run")
    p.add_argument("--precision", default="complex128", choices=("complex128", "complex64"),
                   help="mps.tebd's precision in the timed steps (the warm-up runs in complex128)")
    return p.parse_args()


ARGS = parse()
if ARGS.tenpy_only and ARGS.no_tenpy:
    raise SystemExit("--tenpy-only and --no-tenpy: nothing to time")
if ARGS.untimed_steps + ARGS.steps not in (1, 1 + ARGS.steps):
    raise SystemExit("--untimed-steps: 1 (TeNPy evolves as far as qstage's `more`), or 0 with --steps 1 (as far as `one`)")
for v in THREAD_VARS:
    os.environ[v] = str(ARGS.threads)

import h5py  # noqa: E402  (after the thread variables)
import numpy as np  # noqa: E402

try:
    if ARGS.no_tenpy:
        raise ImportError("--no-tenpy")
    import tenpy
    from tenpy.algorithms.tebd import TEBDEngine
    from tenpy.linalg import np_conserved as npc
    from tenpy.models.xxz_chain import XXZChain
    from tenpy.networks.mps import MPS
    TENPY = tenpy.__version__
except ImportError as e:
    TENPY = None
    why = "--no-tenpy" if ARGS.no_tenpy else f"tenpy is not importable ({e}; pip install physics-tenpy==1.1.1)"
    print(f"# {why}: timing qstage alone", file=sys.stderr)


def blas_info():
    """What numpy links and how many threads it was given (threadpoolctl where installed)."""
    try:
        from threadpoolctl import threadpool_info
        return [{k: d.get(k) for k in ("internal_api", "version", "num_threads")} for d in threadpool_info()]
    except ImportError:
        cfg = np.show_config(mode="dicts") if np.lib.NumpyVersion(np.__version__) >= "1.26.0" else {}
        return cfg.get("Build Dependencies", {}).get("lapack", {}).get("name", "unknown")


FRACTIONS = [float(f) for f in ARGS.budget_fractions.split(",") if f.strip()]


def qstage(spec, run_dir, *extra, check=True):
    """`qstage run spec` in run_dir; returns its stderr (the log). check=False: a failure's last line
    (qstage's one-line error) is returned as ("error", line) instead of stopping the bench."""
    cmd = [ARGS.qstage, "run", str(spec), "--run-dir", str(run_dir), "--device", ARGS.device, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        if not check:
            return ("error", (p.stdout + p.stderr).strip().splitlines()[-1])
        raise SystemExit(f"qstage failed (exit {p.returncode}):\n" + "\n".join((p.stdout + p.stderr).splitlines()[-12:]))
    return p.stderr


def datasets(path):
    with h5py.File(path) as f:
        return {k: f[k][()].tobytes() for k in f if isinstance(f[k], h5py.Dataset)}


def budgeted_runs(chi, per_step):
    """The timed steps again from a copy of the warm run directory, within each fraction of the warm
    state's values: seconds per step, against the in-core per_step, and the same bytes or not."""
    d = Path(ARGS.dir) / f"chi{chi}"
    with h5py.File(d / "warm-run" / "outputs" / "warm.h5") as f:
        values_bytes = int(f["values"].size) * 16
    in_core = datasets(d / "run" / "outputs" / "more.h5")
    out = []
    for fraction in FRACTIONS:
        run_dir = d / f"run-{fraction:g}"
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        subprocess.run(["cp", "-r", str(d / "warm-run"), str(run_dir)], check=True)
        budget = int(values_bytes * fraction)
        log = qstage(d / "spec.yaml", run_dir, "--device-memory", f"{budget}B", check=False)
        if isinstance(log, tuple):
            out.append({"fraction": fraction, "budget_bytes": budget, "error": log[1]})
            continue
        steps = json.loads((run_dir / "manifest.json").read_text())["steps"]
        seconds = (steps["more"]["wall_seconds"] - steps["one"]["wall_seconds"]) / ARGS.steps
        # (the summary line's parts on the updates' sharing of the budget and on grouped updates)
        sharing = ["; ".join(re.findall(r"within the device budget [^;]*|[0-9]+ updates? larger than[^(]*\([^)]*\)", line))
                    for line in log.splitlines() if "mps.tebd:" in line and "updates on" in line]
        out.append({"fraction": fraction, "budget_bytes": budget, "seconds_per_step": seconds,
                    "of_in_core_rate": per_step / seconds if seconds > 0 else None,
                    "same_bytes": datasets(run_dir / "outputs" / "more.h5") == in_core,
                    "log": sharing[-1] if sharing else ""})
    return out


def qstage_run(chi):
    """The workflow above; returns (per-step seconds, the manifest's metrics, the `warm` and `more` files)."""
    d = Path(ARGS.dir) / f"chi{chi}"
    manifest = d / "run" / "manifest.json"
    if not ARGS.tenpy_only:
        subprocess.run(["rm", "-rf", str(d)], check=True)
    d.mkdir(parents=True, exist_ok=True)
    model = f"J: {ARGS.J}, delta: {ARGS.delta}, dt: {ARGS.dt}, order: {ARGS.order}"
    trunc = f"trunc: {{chi_max: {chi}, svd_min: {ARGS.svd_min}, trunc_cut: {ARGS.trunc_cut}}}"
    every = max(1, ARGS.warm_steps // 10)
    if ARGS.start == "random":
        warm = f"""  - id: warm
    stage: mps.init
    params: {{L: {ARGS.L}, state: random, total_charge: {ARGS.L // 2}, chi: {chi}, seed: 1}}
"""
    else:
        warm = f"""  - id: neel
    stage: mps.init
    params: {{L: {ARGS.L}, state: neel}}
  - id: warm
    stage: mps.tebd
    inputs: {{state: neel}}
    params: {{{model}, steps: {ARGS.warm_steps}, measure_every: {every}, {trunc}}}
"""
    timed = "" if ARGS.tenpy_only else (f"""  - id: one
    stage: mps.tebd
    inputs: {{state: warm}}
    params: {{{model}, steps: 1, precision: {ARGS.precision}, {trunc}}}
  - id: more
    stage: mps.tebd
    inputs: {{state: warm}}
    params: {{{model}, steps: {1 + ARGS.steps}, measure_every: {1 + ARGS.steps}, precision: {ARGS.precision}, {trunc}}}
""")
    spec = d / ("spec-warm.yaml" if ARGS.tenpy_only else "spec.yaml")
    spec.write_text(f"name: mps-tebd-bench\nsteps:\n{warm}{timed}")
    if FRACTIONS and not ARGS.tenpy_only:  # (the warm state alone first, kept for the budgeted runs)
        (d / "spec-warm.yaml").write_text(f"name: mps-tebd-bench\nsteps:\n{warm}")
        qstage(d / "spec-warm.yaml", d / "run")
        subprocess.run(["cp", "-r", str(d / "run"), str(d / "warm-run")], check=True)
    t = time.time()
    qstage(spec, d / "run")  # (--tenpy-only: a warm state already there is skipped)
    wall = time.time() - t
    steps = json.loads(manifest.read_text())["steps"]
    out = d / "run" / "outputs"
    if ARGS.tenpy_only:
        return None, {}, wall, "", out / "warm.h5", None
    seconds = {k: steps[k]["wall_seconds"] for k in ("warm", "one", "more")}
    per_step = (seconds["more"] - seconds["one"]) / ARGS.steps
    # (the qstage state TeNPy's evolution is checked against: the one after as many steps)
    same = out / ("one.h5" if ARGS.untimed_steps + ARGS.steps == 1 else "more.h5")
    return per_step, seconds, wall, steps["more"].get("device", ""), out / "warm.h5", same


def tenpy_state(path, sites):
    """qstage's state file as TeNPy's MPS, site by site (a dense site tensor at a time: at chi 4096
    one is 0.5 GB, all of them would be 54 GB). TeNPy's leg charge of bond k is 2 S^z left of it,
    2 (N - c) - k for qstage's c (particles right of it); TeNPy's site basis is [down, up] (sorted
    by charge), qstage's occupations 0, 1: the same order, so no permutation."""
    with h5py.File(path) as f:
        L, d, N = int(f.attrs["L"]), int(f.attrs["d"]), int(f.attrs["total_charge"])
        off, charges, lam = f["bond_offsets"][()], f["bond_charges"][()], f["lambda"][()]
        blocks, boff = f["blocks"][()], f["block_offsets"][()]
        values = f["values"]
        chinfo = sites[0].leg.chinfo
        assert d == 2 and [s.state_labels["up"] for s in sites] == [1] * L
        legs = [npc.LegCharge.from_qflat(chinfo, (2 * (N - charges[off[k]:off[k + 1]]) - k)[:, None]).bunch()[1]
                for k in range(L + 1)]
        Bs, at = [], 0
        for j in range(L):
            dense = np.zeros((off[j + 1] - off[j], d, off[j + 2] - off[j + 1]), complex)
            while at < len(blocks) and blocks[at][0] == j:
                _, cl, cr, r0, c0, rows, cols = blocks[at]
                dense[r0:r0 + rows, cl - cr, c0:c0 + cols] = values[boff[at]:boff[at + 1]].reshape(rows, cols)
                at += 1
            B = npc.Array.from_ndarray(dense, [legs[j], sites[j].leg, legs[j + 1].conj()], labels=["vL", "p", "vR"])
            Bs.append(B)
            del dense
    SVs = [lam[off[k]:off[k + 1]] for k in range(L + 1)]
    return MPS(sites, Bs, SVs, bc="finite", form="B", unit_cell_width=L)


def tenpy_run(chi, warm_path):
    model = XXZChain({"L": ARGS.L, "Jxx": ARGS.J, "Jz": ARGS.J * ARGS.delta, "hz": 0.0, "conserve": "Sz",
                      "bc_MPS": "finite"})
    t = time.time()
    psi = tenpy_state(warm_path, model.lat.mps_sites())
    load = time.time() - t
    print(f"# TeNPy: state loaded in {load:.1f} s", file=sys.stderr, flush=True)
    trunc = {"chi_max": chi, "svd_min": ARGS.svd_min, "trunc_cut": ARGS.trunc_cut}
    eng = TEBDEngine(psi, model, {"order": ARGS.order, "trunc_params": trunc})
    eng.prepare_evolve(ARGS.dt)
    eps = 0.0
    for _ in range(ARGS.untimed_steps):       # the untimed step (qstage's `one`)
        eps += eng.evolve(1, ARGS.dt).eps
    times = []
    for _ in range(ARGS.steps):
        t = time.time()
        eps += eng.evolve(1, ARGS.dt).eps
        times.append(time.time() - t)
    return {"seconds_per_step": statistics.median(times), "step_seconds": times, "load_seconds": load,
            "max_chi": int(max(psi.chi)), "truncation_error": eps,
            "density": psi.expectation_value("Sz").real + 0.5}


def main():
    info = {"L": ARGS.L, "dt": ARGS.dt, "order": ARGS.order, "J": ARGS.J, "delta": ARGS.delta,
            "svd_min": ARGS.svd_min, "trunc_cut": ARGS.trunc_cut, "warm_steps": ARGS.warm_steps,
            "timed_steps": ARGS.steps, "precision": ARGS.precision, "device": ARGS.device, "threads": ARGS.threads, "tenpy": TENPY,
            "numpy": np.__version__, "blas": blas_info()}
    print(f"# {json.dumps(info)}")
    print("| chi_max | warm-up chi | qstage s/step | TeNPy s/step | TeNPy / qstage | max chi qstage / TeNPy | "
          "eps qstage / TeNPy (1 + steps) | max abs dn |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for chi in [int(c) for c in ARGS.chi.split(",")]:
        per_step, seconds, wall, device, warm, more = qstage_run(chi)
        with h5py.File(warm) as f:
            warm_chi = int(f["chi"][-1].max()) if "chi" in f else int(max(f["bond_offsets"][1:] - f["bond_offsets"][:-1]))
        q = {"max_chi": None, "truncation_error": float("nan"), "density": None}
        if more:
            with h5py.File(more) as f:
                q = {"max_chi": int(f["chi"][-1].max()), "truncation_error": float(f["truncation_error"][-1]),
                     "density": f["density"][-1]}
        row = dict(info, chi_max=chi, warm_chi=warm_chi, saturated=warm_chi == chi, qstage_device=device,
                   qstage_seconds_per_step=per_step, qstage_step_seconds=seconds, qstage_wall=wall,
                   qstage_max_chi=q["max_chi"], qstage_truncation_error=q["truncation_error"])
        tp = "–"
        if TENPY:
            t = tenpy_run(chi, warm)
            dn = float(np.max(np.abs(t["density"] - q["density"]))) if more else float("nan")
            row.update(tenpy_seconds_per_step=t["seconds_per_step"], tenpy_step_seconds=t["step_seconds"],
                       tenpy_load_seconds=t["load_seconds"], tenpy_max_chi=t["max_chi"],
                       tenpy_truncation_error=t["truncation_error"],
                       ratio=t["seconds_per_step"] / per_step if per_step else None, max_density_difference=dn)
            ratio = f"{row['ratio']:.3g}" if per_step else "–"
            tp = (f"{t['seconds_per_step']:.4g} | {ratio} | {q['max_chi']} / {t['max_chi']} | "
                  f"{q['truncation_error']:.3e} / {t['truncation_error']:.3e} (after {ARGS.untimed_steps + ARGS.steps} steps) | {dn:.1e}")
        else:
            tp = f"– | – | {q['max_chi']} / – | {q['truncation_error']:.3e} / – | –"
        qs = f"{per_step:.4g}" if per_step else "–"
        print(f"| {chi} | {warm_chi}{'' if warm_chi == chi else ' (not saturated)'} | {qs} | {tp} |", flush=True)
        if FRACTIONS and per_step:
            row["budgeted"] = budgeted_runs(chi, per_step)
        rows.append(row)
    if any("budgeted" in r for r in rows):
        print("\n| chi_max | fraction of the values | budget | s/step | in core s/step | of the in-core rate | same bytes |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            for b in r.get("budgeted", []):
                if "error" in b:
                    print(f"| {r['chi_max']} | {b['fraction']:g} | {b['budget_bytes']} B | failed: {b['error'][:300]} | | | |")
                    continue
                print(f"| {r['chi_max']} | {b['fraction']:g} | {b['budget_bytes']} B | {b['seconds_per_step']:.4g} | "
                      f"{r['qstage_seconds_per_step']:.4g} | {b['of_in_core_rate']:.1%} | {'yes' if b['same_bytes'] else 'NO'} |")
                if b["log"]:
                    print(f"#   {b['log']}")
    for r in rows:
        print(json.dumps(r))
    if ARGS.json:
        Path(ARGS.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
