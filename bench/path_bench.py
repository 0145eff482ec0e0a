#!/usr/bin/env python3
"""Path quality on the CPU: qstage's tn.path against cotengra's hyper-optimizer with the same time
budget on the same networks, and (--slicing) qstage's slicing against cotengra's slicers on the
same unsliced path.

  /tmp/pb/bin/python bench/path_bench.py --qstage build/qstage --python-peer /tmp/pb/bin/python \\
      --seconds 30 --cases n53m20,n56m20,n60m24,big,medium,qaoa --work /tmp/pathb [--threads 1]
  /tmp/pb/bin/python bench/path_bench.py ... --slicing --cases n53m20,big [--target-log2 30]

The peer (cotengra 0.8.3, opt_einsum 3.4.0, autoray 0.11.0, and kahypar 1.3.7, optuna, cmaes where
they install) lives in its own interpreter, --python-peer, e.g. a venv that also sees Debian's
numpy/h5py:
  /usr/bin/python3 -m venv --system-site-packages /tmp/pb
  /tmp/pb/bin/pip install cotengra==0.8.3 opt_einsum==3.4.0 autoray==0.11.0 kahypar==1.3.7 optuna cmaes
This script runs under any Python with h5py, e.g. /usr/bin/python3 or that venv (it calls the peer on itself with
--peer-job; that side needs only cotengra). The report says which peer packages were used.

Cases (one amplitude or one expectation value each; `name:K` on the command line sets a cap of
2^K elements on the largest intermediate, `name:none` removes the case's cap):
  n53m20, n56m20, n60m24  the qsim files (--circuits; Sycamore-style, 20/20/24 cycles), the
                          all-zeros bitstring, capped at 2^30 elements (8 GiB of complex64)
  big      tn_bench's big: 5 x 8 grid, 12 cycles, seed 1 (uncapped here)
  medium   tn_bench's medium: 6 x 9 grid, 10 cycles, seed 1 (uncapped)
  qaoa     QAOA MaxCut on a random 3-regular graph (30 nodes, p = 4, seed 1), <Z0 Z1> over its
           light cone (the doubled network <psi|Z0 Z1|psi>); qaoa_p6 the same with p = 6
  small    4 x 5 grid, 10 cycles (checks the script in seconds)
  dec7_phen, dec7_circ  seed 000's distance-7 decoding networks, 7 rounds, in the Fourier form,
           simplified (hyperindices): the rotated surface code under phenomenological noise (p = q =
           0.01, tn.build's surface_code) and under circuit-level noise 0.001 (stim's model, --dem
           or generated with stim into --work)

What each side gets (the same T seconds, the same thread count):
  qstage   `qstage run` of tn.build + tn.path with params {max_seconds: T, seed: S} (--ours default:
           {seed: S} alone, tn.path's own budget) plus
           max_intermediate: 2^K * 8 bytes for a capped case, threads: N where the binary's tn.path
           knows `threads` (OMP_NUM_THREADS=N is set either way), max_tries: 10^9 where the binary's
           max_tries has a default (the old tn.path stops after 256 tries otherwise), and whatever
           --path-params adds (JSON). Seconds: the step's own qstage.wall_seconds (tn.build excluded).
  cotengra HyperOptimizer(methods=['greedy', 'kahypar'] (['greedy'] when kahypar does not import),
           max_time=T, max_repeats=10**9, minimize='flops', parallel=False for 1 thread else N,
           reconf_opts={}, slicing_reconf_opts={'target_size': 2**K} for a capped case (else None;
           with --ctg-slicing plain: slicing_opts={'target_size': 2**K} instead),
           optlib=None (cotengra's default: optuna if installed, else cmaes, else sbplx), progbar=False)
           .search(inputs, output, size_dict) on the network JSON that tn.build wrote (mode labels
           as integers). Seconds: wall time of .search (pool start included). max_time is checked
           between trials: a trial that starts before T runs to its end, so cotengra overruns T,
           badly on the qsim networks (3369+ raw tensors): one trial of n53m20 with
           slicing_reconf_opts ran over 30 minutes on this 2-core machine (killed), with slicing_opts
           161 s. --peer-timeout stops a cotengra search (SIGTERM, 30 s of grace): it reports the best tree
           of the trials done by then (marked "stopped"), or no ratio if none had finished.
Both results are scored by one evaluator here (the SSA path and the sliced modes): C_t is the
total multiply-adds over all slices, every step once per slice (cotengra's contraction_cost;
"reuse" columns count slice-invariant steps, those whose leaves hold no sliced mode, once, as
qstage's tn.path and tn.plan do); C_s the largest tensor of one slice, inputs included. Real flops
for complex data are 8x the multiply-adds. The evaluator is checked against each tool's own
numbers (qstage's cost attribute, cotengra's contraction_cost) and the report says if they differ.
"equal or better": our total C_t (without reuse) <= cotengra's, and within the cap where there is one.
A capped case whose tn.path returns an unsliced path over the cap (the old tn.path) is reported as
such; --plan-fallback slices it with tn.plan first (slow for the old tn.plan on the qsim networks).

--slicing: tn.path without a cap gives qstage's unsliced path P for each case (T seconds); then
  ours     tn.plan (budget 2^K * 8 bytes, complex64, bandwidth and gemm_rate given so nothing is
           measured, max_slices 1e15) slices P until one slice's arena fits; the arena holds more than
           the largest tensor, so it reaches some log2 C_s = A <= K - 1. With --our-slicer import (or
           plan,import), also tn.path {import: P, format: ssa, max_intermediate: 2^K * 8 bytes}, for a
           tn.path that slices imported paths.
  cotengra ContractionTree.from_path(inputs, output, size_dict, ssa_path=P), then
           tree.slice(target_size=2**A) (defaults: temperature=0.01, max_repeats=16, minimize=None,
           allow_outer=True) and tree.slice_and_reconfigure(target_size=2**A) (defaults: step_size=2,
           temperature=0.01, max_repeats=16, reconf_opts=None), for A = each target our slicers
           reached and A = K itself.
  overhead = sliced total multiply-adds / P's total (without and with reuse). Reconfiguring slicers
  also improve the path itself, so on a poor P an overhead below 1 is possible: compare slicers on
  a good unsliced path.
K: --target-log2, else the case's cap, else floor(log2 C_s of P) - 6.

Prints one JSON object and then a markdown table (stdout); progress goes to stderr; after each case
the report so far is in WORK/report-quality.json (or report-slicing.json).
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from qstage_runs import h5attrs, run_spec, run_with_timeout, spec_text

HERE = Path(__file__).resolve()

CASES = {
    "n53m20": {"build": {"circuit": "{circuits}/circuit_n53_m20_s0_e0_pABCDCDAB.qsim"}, "cap": 30},
    "n56m20": {"build": {"circuit": "{circuits}/circuit_n56_m20_s0_e0_pABCDCDAB.qsim"}, "cap": 30},
    "n60m24": {"build": {"circuit": "{circuits}/circuit_n60_m24_s0_e0_pABCDCDAB.qsim"}, "cap": 30},
    "big": {"build": {"random": {"rows": 5, "cols": 8, "cycles": 12, "seed": 1}}, "cap": None},
    "medium": {"build": {"random": {"rows": 6, "cols": 9, "cycles": 10, "seed": 1}}, "cap": None},
    "qaoa": {"build": {"qaoa": {"nodes": 30, "p": 4, "seed": 1}, "pauli": "Z0 Z1"}, "cap": None},
    "qaoa_p6": {"build": {"qaoa": {"nodes": 30, "p": 6, "seed": 1}, "pauli": "Z0 Z1"}, "cap": None},
    "small": {"build": {"random": {"rows": 4, "cols": 5, "cycles": 10, "seed": 1}}, "cap": None},
    # seed 000's distance-7 decoding networks in the Fourier form, simplified (hyperindices)
    "dec7_phen": {"build": {"surface_code": {"distance": 7, "rounds": 7, "p": 0.01, "q": 0.01, "seed": 1,
                                             "form": "fourier"}, "simplify": True}, "cap": None},
    "dec7_circ": {"build": {"detector_error_model": {"file": "{dem}", "seed": 1, "form": "fourier"}, "simplify": True},
                  "cap": None},
}

# dec7_circ's detector error model: stim's rotated surface-code memory experiment, distance 7,
# 7 rounds, circuit-level noise 0.001 (336 detectors, 6023 mechanisms), as in seed 000's Fig. 1 (b).
DEM_CIRCUIT = dict(code_task="surface_code:rotated_memory_z", distance=7, rounds=7,
                   after_clifford_depolarization=0.001, before_measure_flip_probability=0.001,
                   after_reset_flip_probability=0.001, before_round_data_depolarization=0.001)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def size_string(log2_elements, element_bytes=8):
    """2^K elements as a size tn.path and tn.plan parse: 2^30 complex64 -> '8GiB'."""
    b = int(log2_elements) + int(math.log2(element_bytes))
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= shift:
            return f"{2 ** (b - shift)}{unit}"
    return str(2 ** b)


# ------------------------------------------------------------------------ the common evaluator
def tree_costs(inputs, output, sizes, ssa, sliced=()):
    """C_t (multiply-adds over all slices, each step once per slice, and with slice-invariant steps
    once), C_s (largest tensor of one slice, inputs included) of an SSA path, as qstage's
    path_cost and cotengra's ContractionTree count them."""
    sliced = set(sliced)
    ext = lambda m: 1 if m in sliced else sizes[m]
    out = set(output)
    live = {}
    for t in inputs:
        for m in t:
            live[m] = live.get(m, 0) + 1
    modes = [list(t) for t in inputs]
    dep = [any(m in sliced for m in t) for t in inputs]  # the tensor changes from slice to slice
    largest = max((math.prod(ext(m) for m in t) for t in inputs), default=1)
    per_slice = invariant = 0.0
    if len(ssa) != len(inputs) - 1:
        raise ValueError(f"the path has {len(ssa)} steps; {len(inputs)} tensors need {len(inputs) - 1}")
    for a, b in ssa:
        A, B = modes[a], modes[b]
        setb = set(B)
        union = A + [m for m in B if m not in set(A)]
        keep = [m for m in union if m not in sliced and (m in out or live[m] > (2 if (m in setb and m in A) else 1))]
        for m in A:
            live[m] -= 1
        for m in B:
            live[m] -= 1
        for m in keep:
            live[m] += 1
        flops = float(math.prod(ext(m) for m in union))
        per_slice += flops
        d = dep[a] or dep[b]
        if not d:
            invariant += flops
        modes.append(keep)
        dep.append(d)
        largest = max(largest, math.prod(ext(m) for m in keep))
    slices = math.prod(sizes[m] for m in sliced)
    total = per_slice * slices
    reuse = invariant + (per_slice - invariant) * slices
    return {"log10_C_t": math.log10(max(total, 1)), "log10_C_t_reuse": math.log10(max(reuse, 1)),
            "log2_C_s": math.log2(max(largest, 1)), "slices": slices, "sliced_modes": len(sliced),
            "C_t_total": total, "C_t_total_reuse": reuse, "C_t_per_slice": per_slice,
            "flops_total": 8 * total}


# ------------------------------------------------------------------------ the peer (cotengra)
def peer_versions():
    import importlib
    v = {}
    for name in ("cotengra", "opt_einsum", "autoray", "kahypar", "optuna", "cmaes", "numpy"):
        try:
            mod = importlib.import_module(name)
            v[name] = getattr(mod, "__version__", "installed")
        except Exception as e:  # noqa: BLE001 - any import failure means "not used"
            v[name] = f"missing ({type(e).__name__})"
    if not v["kahypar"].startswith("missing"):
        try:  # kahypar has no __version__; its distribution does
            from importlib.metadata import version
            v["kahypar"] = version("kahypar")
        except Exception:  # noqa: BLE001
            pass
    return v


_PEER_STOPPED = [None]  # the running search's report of its best tree so far


def peer_job(job_file):
    """Runs inside --python-peer: cotengra's search or slicers, one JSON object on stdout."""
    import cotengra as ctg
    from cotengra.hyperoptimizers.hyper import get_default_optlib
    job = json.loads(Path(job_file).read_text())
    inputs = [tuple(t) for t in job["inputs"]]
    output = tuple(job["output"])
    sizes = {int(k): int(v) for k, v in job["size_dict"].items()}
    res = {"versions": peer_versions()}
    if job["mode"] == "search":
        methods = ["greedy"]
        try:
            import kahypar  # noqa: F401
            methods.append("kahypar")
        except ImportError:
            pass
        threads = int(job["threads"])
        capped = job["cap"] is not None
        kw = dict(methods=methods, max_time=float(job["seconds"]), max_repeats=10**9, minimize="flops",
                  parallel=False if threads <= 1 else threads, reconf_opts={},
                  slicing_reconf_opts={"target_size": 2 ** job["cap"]} if capped and job["slicing"] == "reconf" else None,
                  slicing_opts={"target_size": 2 ** job["cap"]} if capped and job["slicing"] == "plain" else None,
                  optlib=None, progbar=False)
        t0 = time.perf_counter()
        opt = ctg.HyperOptimizer(**kw)

        def found(tree, stopped):
            best = getattr(opt, "best", {}) or {}
            return {**res, "seconds": time.perf_counter() - t0, "trials": len(opt.scores), "stopped": stopped,
                    "settings": {**{k: v for k, v in kw.items()}, "optlib_used": get_default_optlib()},
                    "best_method": (best.get("params") or {}).get("method"),
                    "trials_by_method": {m: opt.method_choices.count(m) for m in set(opt.method_choices)},
                    "ssa": [list(p) for p in tree.get_ssa_path()], "sliced": [int(i) for i in tree.sliced_inds],
                    "own": {"log10_C_t": math.log10(max(tree.contraction_cost(), 1)),
                            "log2_C_s": float(tree.contraction_width()), "slices": int(tree.nslices)}}

        # Stopped from outside (--peer-timeout: max_time is checked between trials, and trials
        # overrun it): the best tree of the trials done so far (main() calls this on SIGTERM).
        def stopped():
            if "tree" in (getattr(opt, "best", {}) or {}):
                return found(opt.best["tree"], "at --peer-timeout, with the trials done by then")
            return None

        _PEER_STOPPED[0] = stopped
        tree = opt.search(inputs, output, sizes)
        res = found(tree, None)
    elif job["mode"] == "slice":
        tree = ctg.ContractionTree.from_path(inputs, output, sizes, ssa_path=[tuple(p) for p in job["ssa"]])
        res["results"] = []
        for target in job["targets"]:
            for how in ("slice", "slice_and_reconfigure"):
                t0 = time.perf_counter()
                fn = getattr(tree, how)
                sliced_tree = fn(target_size=2 ** target)  # cotengra's defaults otherwise (docstring)
                res["results"].append({
                    "how": how, "target_log2": target, "seconds": time.perf_counter() - t0,
                    "ssa": [list(p) for p in sliced_tree.get_ssa_path()],
                    "sliced": [int(i) for i in sliced_tree.sliced_inds],
                    "own": {"log10_C_t": math.log10(max(sliced_tree.contraction_cost(), 1)),
                            "log2_C_s": float(sliced_tree.contraction_width()), "slices": int(sliced_tree.nslices)}})
    print(json.dumps(res))


def run_peer(args, job):
    """The peer's JSON, or None if it ran past --peer-timeout."""
    job_file = Path(args.work) / f"peer-job-{os.getpid()}.json"
    job_file.write_text(json.dumps(job))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    try:
        r = run_with_timeout([args.python_peer, str(HERE), "--peer-job", str(job_file)], env, args.peer_timeout,
                             grace=30)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode == 3:  # stopped before any trial had finished (or a slicing job)
        return None
    if r.returncode != 0:
        sys.exit(f"the peer ({args.python_peer}) failed ({r.returncode}):\n{r.stderr[-3000:]}")
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        sys.exit(f"the peer printed no JSON:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


# ------------------------------------------------------------------------ qstage
_SCHEMAS = {}


def stage_params(args, stage):
    """The parameter schema the binary carries for `stage` (old and new tn.path differ)."""
    if stage not in _SCHEMAS:
        r = subprocess.run([args.qstage, "stages", stage, "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"'{args.qstage} stages {stage} --json' failed:\n{r.stderr}")
        j = json.loads(r.stdout)
        j = j[0] if isinstance(j, list) else j
        _SCHEMAS[stage] = j["parameters"].get("properties", {})
    return _SCHEMAS[stage]


def path_params(args, cap=None, extra=None):
    props = stage_params(args, "tn.path")
    p = {"seed": args.seed}
    if args.ours == "same":
        p["max_seconds"] = args.seconds
        if "default" in props.get("max_tries", {}):
            p["max_tries"] = 10**9  # the old tn.path: 256 tries at most by default
    if "threads" in props:
        p["threads"] = args.threads
    if cap is not None:
        p["max_intermediate"] = size_string(cap)
    p.update(json.loads(args.path_params) if args.path_params else {})
    p.update(extra or {})
    return p


class QstageTimeout(Exception):
    pass


def qstage_run(args, steps, run_dir, timeout=None):
    """steps: [(id, stage, inputs dict, params dict)]; runs them on the CPU; returns stderr."""
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    try:
        return run_spec(args.qstage, spec_text(f"pathbench-{run_dir.name}", steps), run_dir, "cpu", env=env,
                        timeout=timeout)
    except subprocess.TimeoutExpired:
        raise QstageTimeout(f"qstage did not finish {run_dir.name}.yaml in {timeout:g} s") from None


def load_network(out_dir):
    import h5py
    with h5py.File(out_dir / "net.h5") as f:
        net = json.loads(bytes(f["network"][()]).decode())
    net["size_dict"] = {int(k): int(v) for k, v in net["size_dict"].items()}
    return net


def read_path(out_dir, name="path"):
    import h5py
    with h5py.File(out_dir / f"{name}.h5") as f:
        ssa = [tuple(map(int, r)) for r in f["path"][()].reshape(-1, 2)]
        sliced = [int(m) for m in f["sliced"][()]] if "sliced" in f else []
    a = h5attrs(out_dir / f"{name}.h5")
    res = {"ssa": ssa, "sliced": sliced, "own": json.loads(a["cost"]), "method": a.get("method", ""),
           "seconds": float(a.get("qstage.wall_seconds", "nan"))}
    if "search" in a:
        res["search"] = json.loads(a["search"])
    return res


def build_params(args, case):
    b = json.loads(json.dumps(case["build"]))
    if "circuit" in b:  # the first of the --circuits folders that holds the file
        name = Path(b["circuit"]).name
        dirs = [Path(d) for d in args.circuits.split(":")]
        found = [d / name for d in dirs if (d / name).exists()]
        if not found:
            sys.exit(f"{name} is in none of {args.circuits}")
        b["circuit"] = str(found[0].resolve())
    dem = b.get("detector_error_model", {})
    if dem.get("file") == "{dem}":
        dem["file"] = str(detector_error_model_file(args))
    return b


def detector_error_model_file(args):
    """--dem, or stim's model written into --work (the Python running this script needs stim)."""
    if args.dem:
        return Path(args.dem).resolve()
    path = Path(args.work).resolve() / "d7r7.dem"
    if not path.exists():
        try:
            import stim
        except ImportError:
            sys.exit("dec7_circ needs a detector error model: --dem FILE, or stim importable here "
                     "(e.g. run this script with build/oracles/bin/python)")
        circuit = stim.Circuit.generated(**DEM_CIRCUIT)
        path.write_text(str(circuit.detector_error_model(decompose_errors=False)))
    return path


def step_log(stderr, step):
    return [line.split("result: ", 1)[1] for line in stderr.splitlines() if f"'{step}' result" in line]


def evaluate(net, ssa, sliced):
    return tree_costs(net["inputs"], net["output"], net["size_dict"], ssa, sliced)


def check(ev, own, who, log10_key="log10_C_t"):
    """The evaluator against a tool's own numbers; returns a note when they differ."""
    notes = []
    if own.get(log10_key) is not None and abs(own[log10_key] - ev["log10_C_t"]) > 1e-6:
        notes.append(f"{who} reports log10 C_t {own[log10_key]:.4f}, the evaluator {ev['log10_C_t']:.4f}")
    if own.get("log2_C_s") is not None and own["log2_C_s"] > ev["log2_C_s"] + 1e-6:
        notes.append(f"{who} reports log2 C_s {own['log2_C_s']:.3f}, the evaluator {ev['log2_C_s']:.3f}")
    return notes


def qstage_own_total(own):
    """log10 of the total over slices from qstage's cost attribute (per slice x slices)."""
    if "log10_C_t_total" in own:
        return own["log10_C_t_total"]
    return math.log10(max(own["C_t_multiply_adds"] * own.get("slices", 1), 1))


# ------------------------------------------------------------------------ the two modes
def quality(args, name, case, cap):
    budget = "default" if args.ours == "default" else f"{args.seconds:g}"  # (tn.path's time, in the folder's name)
    run_dir = Path(args.work) / f"{name}-q{'-cap' + str(cap) if cap is not None else ''}-T{budget}-s{args.seed}"
    steps = [("net", "tn.build", None, build_params(args, case)),
             ("path", "tn.path", {"network": "net"}, path_params(args, cap))]
    log(f"{name}: qstage tn.path, {'its default budget' if args.ours == 'default' else budget + ' s'}"
        f"{f', cap 2^{cap}' if cap is not None else ''}")
    err = qstage_run(args, steps, run_dir)
    out = run_dir / "outputs"
    net = load_network(out)
    ours = read_path(out)
    ev = evaluate(net, ours["ssa"], ours["sliced"])
    res = {"tensors": len(net["inputs"]), "cap_log2": cap, "qstage_params": steps[1][3],
           "qstage": {**ev, "seconds": ours["seconds"], "method": ours["method"], "log": step_log(err, "path"),
                      "own_cost": ours["own"], **({"search": ours["search"]} if "search" in ours else {})}}
    notes = check(ev, {"log10_C_t": qstage_own_total(ours["own"]), "log2_C_s": ours["own"].get("log2_C_s")}, "qstage")
    if cap is not None and ev["log2_C_s"] > cap + 1e-9:
        res["qstage"]["within_cap"] = False
        log(f"{name}: qstage's path has log2 C_s {ev['log2_C_s']:.1f} > {cap} and is not sliced")
    if cap is not None and ev["log2_C_s"] > cap + 1e-9 and args.plan_fallback:
        # The old tn.path does not slice: slice its path the way tn.contract would (tn.plan), so
        # the total over slices compares with cotengra's.
        log(f"{name}: slicing qstage's path with tn.plan")
        try:
            res["qstage_plan_sliced"] = plan_slice(args, run_dir, steps, cap)
            res["qstage_plan_sliced"].pop("ssa")
        except QstageTimeout as e:
            res["qstage_plan_sliced_failed"] = str(e)
            log(f"{name}: {e}")
    log(f"{name}: cotengra hyper-optimizer, {args.seconds:g} s")
    peer = run_peer(args, {"mode": "search", "inputs": net["inputs"], "output": net["output"],
                           "size_dict": net["size_dict"], "seconds": args.seconds, "threads": args.threads, "cap": cap,
                           "slicing": args.ctg_slicing})
    if peer is None:
        res["cotengra"] = {"error": f"no trial finished within --peer-timeout {args.peer_timeout:g} s (a trial that "
                                    f"starts before max_time runs to its end)"}
        res["equal_or_better"] = None
        log(f"{name}: cotengra: {res['cotengra']['error']}")
        return res
    cev = evaluate(net, [tuple(p) for p in peer["ssa"]], peer["sliced"])
    notes += check(cev, peer["own"], "cotengra")
    res["cotengra"] = {**cev, "seconds": peer["seconds"], "trials": peer["trials"], "stopped": peer.get("stopped"),
                       "best_method": peer["best_method"],
                       "trials_by_method": peer["trials_by_method"],
                       "settings": peer["settings"], "own": peer["own"]}
    res["peer_versions"] = peer["versions"]
    mine = res["qstage_plan_sliced"]["qstage"] if "qstage_plan_sliced" in res else ev
    res["ratio_C_t"] = 10 ** (mine["log10_C_t"] - cev["log10_C_t"])  # ours / cotengra, > 1: ours needs more
    res["ratio_C_t_reuse"] = 10 ** (mine["log10_C_t_reuse"] - cev["log10_C_t_reuse"])
    res["delta_log2_C_s"] = mine["log2_C_s"] - cev["log2_C_s"]
    res["equal_or_better"] = bool(mine["log10_C_t"] <= cev["log10_C_t"] + 1e-9 and
                                  (cap is None or mine["log2_C_s"] <= cap + 1e-9))
    if notes:
        res["notes"] = notes
    log(f"{name}: qstage {mine['log10_C_t']:.3f} / {mine['log2_C_s']:.1f} ({ours['seconds']:.1f} s); "
        f"cotengra {cev['log10_C_t']:.3f} / {cev['log2_C_s']:.1f} ({peer['seconds']:.1f} s, {peer['trials']} trials)")
    return res


def plan_slice(args, run_dir, steps, target):
    """Ours: tn.plan slices the path of `steps` (build + path) to an arena of 2^target * 8 bytes."""
    plan = ("plan", "tn.plan", {"network": "net", "path": "path"},
            {"budget": size_string(target), "precision": "complex64", "bandwidth": 1e12, "gemm_rate": 5e13,
             "max_slices": 1e15})
    t0 = time.perf_counter()
    err = qstage_run(args, steps + [plan], run_dir, timeout=args.plan_timeout)
    out = run_dir / "outputs"
    import h5py
    with h5py.File(out / "plan.h5") as f:
        planned = json.loads(bytes(f["plan"][()]).decode())
    a = h5attrs(out / "plan.h5")
    ssa = [(s["a"], s["b"]) for s in planned["steps"]]
    net = load_network(out)
    ev = evaluate(net, ssa, planned["sliced"])
    return {"how": f"tn.plan, budget {plan[3]['budget']}", "target_log2": target, "ssa": ssa,
            "sliced": planned["sliced"], "qstage": ev, "seconds": float(a.get("qstage.wall_seconds", "nan")),
            "run_seconds": time.perf_counter() - t0, "log": step_log(err, "plan"),
            "own_cost": planned.get("cost"), "slicing_overhead_attr": a.get("slicing_overhead")}


def import_slice(args, run_dir, steps, ssa, target):
    """Ours: tn.path imports the unsliced path and slices it to 2^target (a tn.path that can)."""
    pfile = run_dir.parent / f"{run_dir.name}-path.json"
    pfile.write_text(json.dumps([list(p) for p in ssa]))
    imp = ("sliced", "tn.path", {"network": "net"},
           {"import": str(pfile), "format": "ssa", "max_intermediate": size_string(target)})
    err = qstage_run(args, steps + [imp], run_dir, timeout=args.plan_timeout)
    out = run_dir / "outputs"
    r = read_path(out, "sliced")
    net = load_network(out)
    ev = evaluate(net, r["ssa"], r["sliced"])
    return {"how": f"tn.path import + max_intermediate {imp[3]['max_intermediate']}", "target_log2": target,
            "ssa": r["ssa"], "sliced": r["sliced"], "qstage": ev, "seconds": r["seconds"],
            "log": step_log(err, "sliced"), "own_cost": r["own"]}


def slicing(args, name, case, cap):
    run_dir = Path(args.work) / f"{name}-slicing-T{args.seconds:g}-s{args.seed}"
    steps = [("net", "tn.build", None, build_params(args, case)),
             ("path", "tn.path", {"network": "net"}, path_params(args, None))]
    log(f"{name}: qstage's unsliced path ({args.seconds:g} s)")
    qstage_run(args, steps, run_dir)
    out = run_dir / "outputs"
    net = load_network(out)
    P = read_path(out)
    if P["sliced"]:
        sys.exit(f"{name}: tn.path sliced the path without a cap ({P['sliced']}); expected an unsliced path")
    base = evaluate(net, P["ssa"], [])
    target = args.target_log2 if args.target_log2 is not None else cap
    if target is None:
        target = int(math.floor(base["log2_C_s"])) - 6
    res = {"tensors": len(net["inputs"]), "target_log2": target, "unsliced": {**base, "seconds": P["seconds"]},
           "ours": [], "cotengra": []}
    if base["log2_C_s"] <= target:
        res["note"] = f"the unsliced path already fits 2^{target}"
        return res
    for how in args.our_slicer.split(","):
        log(f"{name}: our slicer ({how}) to 2^{target}")
        try:
            r = plan_slice(args, run_dir, steps, target) if how == "plan" else import_slice(args, run_dir, steps, P["ssa"], target)
        except QstageTimeout as e:
            log(f"{name}: {e}")
            res.setdefault("failed", []).append({"how": how, "error": str(e)})
            continue
        r["fits_target"] = bool(r["qstage"]["log2_C_s"] <= target + 1e-9)
        if not r["fits_target"]:
            log(f"{name}: {r['how']} left log2 C_s {r['qstage']['log2_C_s']:.1f} > {target}")
        r["overhead"] = r["qstage"]["C_t_total"] / base["C_t_total"]
        r["overhead_reuse"] = r["qstage"]["C_t_total_reuse"] / base["C_t_total"]
        res["ours"].append(r)
    targets = sorted({target} | {int(round(r["qstage"]["log2_C_s"])) for r in res["ours"]
                                 if r["qstage"]["log2_C_s"] < base["log2_C_s"]})
    log(f"{name}: cotengra's slicers on the same path to 2^{targets}")
    peer = run_peer(args, {"mode": "slice", "inputs": net["inputs"], "output": net["output"],
                           "size_dict": net["size_dict"], "ssa": [list(p) for p in P["ssa"]], "targets": targets,
                           "threads": args.threads})
    if peer is None:
        res["cotengra_error"] = f"no result within --peer-timeout {args.peer_timeout:g} s"
        log(f"{name}: cotengra: {res['cotengra_error']}")
        return res
    res["peer_versions"] = peer["versions"]
    for r in peer["results"]:
        ev = evaluate(net, [tuple(p) for p in r["ssa"]], r["sliced"])
        notes = check(ev, r["own"], f"cotengra {r['how']}")
        res["cotengra"].append({"how": r["how"], "target_log2": r["target_log2"], "seconds": r["seconds"],
                                "sliced": r["sliced"], "cotengra": ev, "own": r["own"],
                                "overhead": ev["C_t_total"] / base["C_t_total"],
                                "overhead_reuse": ev["C_t_total_reuse"] / base["C_t_total"],
                                **({"notes": notes} if notes else {})})
    for r in res["ours"]:  # ours against cotengra at the size ours reached
        reached = int(round(r["qstage"]["log2_C_s"]))
        for c in res["cotengra"]:
            if c["target_log2"] == reached:
                r[f"vs_{c['how']}"] = r["overhead"] / c["overhead"]
        for k in ("ssa",):
            r.pop(k, None)
    return res


# ------------------------------------------------------------------------ report
def fmt(x, spec):
    return "" if x is None else format(x, spec)


def markdown(report):
    rows = []
    if report["mode"] == "quality":
        rows.append("| case | cap | qstage log10 C_t (reuse) | log2 C_s | slices | s | cotengra log10 C_t (reuse) | "
                    "log2 C_s | slices | s | trials | C_t ours/ctg | equal or better |")
        rows.append("|" + " --- |" * 13)
        for name, r in report["cases"].items():
            q = r.get("qstage_plan_sliced", {}).get("qstage", r["qstage"])
            c = r["cotengra"]
            if "error" in c:
                rows.append(f"| {name} | {'2^' + str(r['cap_log2']) if r['cap_log2'] is not None else '-'} | "
                            f"{q['log10_C_t']:.3f} ({q['log10_C_t_reuse']:.3f}) | {q['log2_C_s']:.1f} | {q['slices']:.0f} | "
                            f"{r['qstage']['seconds']:.1f} | cotengra: {c['error']} | | | | | | |")
                continue
            tag = (" (tn.plan sliced)" if "qstage_plan_sliced" in r else
                   " (over the cap, unsliced)" if r["qstage"].get("within_cap") is False else "")
            rows.append(f"| {name} | {'2^' + str(r['cap_log2']) if r['cap_log2'] is not None else '-'} | "
                        f"{q['log10_C_t']:.3f} ({q['log10_C_t_reuse']:.3f}){tag} | {q['log2_C_s']:.1f} | {q['slices']:.0f} | "
                        f"{r['qstage']['seconds']:.1f} | {c['log10_C_t']:.3f} ({c['log10_C_t_reuse']:.3f}) | "
                        f"{c['log2_C_s']:.1f} | {c['slices']:.0f} | {c['seconds']:.1f} | {c['trials']} | "
                        f"{r['ratio_C_t']:.3g} | {'yes' if r['equal_or_better'] else 'no'} |")
    else:
        rows.append("| case | unsliced log10 C_t / log2 C_s | slicer | target 2^ | log2 C_s | slices | overhead "
                    "(reuse) | s |")
        rows.append("|" + " --- |" * 8)
        for name, r in report["cases"].items():
            u = r["unsliced"]
            head = f"| {name} | {u['log10_C_t']:.3f} / {u['log2_C_s']:.1f} |"
            if "note" in r:
                rows.append(f"{head} {r['note']} | | | | | |")
                continue
            for o in r["ours"]:
                e = o["qstage"]
                rows.append(f"{head} qstage {o['how']}{'' if o['fits_target'] else ' (misses the target)'} | "
                            f"{o['target_log2']} | {e['log2_C_s']:.1f} | {e['slices']:.0f} | "
                            f"{o['overhead']:.3g} ({o['overhead_reuse']:.3g}) | {o['seconds']:.1f} |")
                head = "| | |"
            for fail in r.get("failed", []):
                rows.append(f"{head} qstage {fail['how']}: {fail['error']} | | | | | |")
                head = "| | |"
            for c in r["cotengra"]:
                e = c["cotengra"]
                rows.append(f"{head} cotengra {c['how']} | {c['target_log2']} | {e['log2_C_s']:.1f} | "
                            f"{e['slices']:.0f} | {c['overhead']:.3g} ({c['overhead_reuse']:.3g}) | {c['seconds']:.1f} |")
                head = "| | |"
    return "\n".join(rows)


def parse_cases(text):
    out = []
    for item in text.split(","):
        name, _, cap = item.partition(":")
        if name not in CASES:
            sys.exit(f"unknown case '{name}'; expected one of {', '.join(CASES)}")
        c = CASES[name]["cap"] if not cap else (None if cap == "none" else int(cap))
        out.append((item, name, c))  # reported under what was typed, e.g. big:30
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--peer-job":
        # cotengra walks trees recursively: a 3368-step tree of a 53-qubit circuit exceeded
        # Python's default recursion limit in ContractionTree.slice. A thread with a large stack
        # takes the deep recursion.
        import threading
        sys.setrecursionlimit(200000)
        threading.stack_size(1 << 30)
        failure = []

        def stop(signum, frame):  # (the search runs on the thread below; handlers run on this one)
            report = _PEER_STOPPED[0]() if _PEER_STOPPED[0] else None
            if report is not None:
                print(json.dumps(report), flush=True)
                os._exit(0)
            os._exit(3)

        signal.signal(signal.SIGTERM, stop)

        def job():
            try:
                peer_job(sys.argv[2])
            except BaseException as e:  # noqa: BLE001 - re-raised below, on the main thread
                failure.append(e)
        t = threading.Thread(target=job)
        t.start()
        while t.is_alive():  # (a signal sent to the process may land on another thread: wake up to run the handler)
            t.join(0.5)
        if failure:
            raise failure[0]
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qstage", required=True)
    ap.add_argument("--python-peer", required=True, help="a Python interpreter that imports cotengra")
    ap.add_argument("--seconds", type=float, default=30, help="time budget T for each search")
    ap.add_argument("--cases", default="n53m20,n56m20,n60m24,big,medium,qaoa")
    ap.add_argument("--work", default="/tmp/pathbench")
    ap.add_argument("--circuits", default=f"{HERE.parent.parent / 'tests' / 'data' / 'circuits'}:"
                                           f"{HERE.parent.parent.parent / 'shared' / 'data' / 'circuits'}",
                    help="folders of the qsim files, ':'-separated, the first that has a file wins "
                         "(default: tests/data/circuits, then ../shared/data/circuits beside the checkout)")
    ap.add_argument("--threads", type=int, default=1, help="threads for both searches (default 1)")
    ap.add_argument("--ours", choices=["same", "default"], default="same",
                    help="tn.path's time: same (max_seconds: --seconds, as cotengra) or default (its own budget, "
                         "fitted to the predicted contraction time: what a user gets without max_seconds)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dem", default="", help="dec7_circ's stim .dem file (default: made with stim in --work)")
    ap.add_argument("--path-params", default="", help="JSON merged into tn.path's params, e.g. '{\"methods\": [\"greedy\"]}'")
    ap.add_argument("--slicing", action="store_true", help="compare slicers on qstage's unsliced path instead")
    ap.add_argument("--target-log2", type=int, default=None, help="--slicing: the target 2^K elements")
    ap.add_argument("--our-slicer", default="plan", help="--slicing: plan, import, or plan,import")
    ap.add_argument("--ctg-slicing", choices=["reconf", "plain"], default="reconf",
                    help="capped cases: cotengra's slicing_reconf_opts (reconf, the default) or slicing_opts (plain)")
    ap.add_argument("--peer-timeout", type=float, default=None,
                    help="seconds before a cotengra job is given up (default: none)")
    ap.add_argument("--plan-fallback", action="store_true",
                    help="capped cases whose tn.path returns an unsliced path over the cap (the old tn.path): slice "
                         "it with tn.plan (budget 2^K * 8 bytes) before comparing")
    ap.add_argument("--plan-timeout", type=float, default=900,
                    help="seconds for qstage's slicing runs (tn.plan, or tn.path import) before giving up")
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    r = subprocess.run([args.qstage, "--version"], capture_output=True, text=True)
    report = {"mode": "slicing" if args.slicing else "quality", "seconds": args.seconds, "threads": args.threads,
              "seed": args.seed, "qstage": r.stdout.strip().splitlines()[0] if r.stdout else args.qstage,
              "tn.path_parameters": sorted(stage_params(args, "tn.path")), "host": os.uname().nodename,
              "cpus": os.cpu_count(), "cases": {}}
    partial = Path(args.work) / f"report-{report['mode']}.json"
    for key, name, cap in parse_cases(args.cases):
        report["cases"][key] = slicing(args, name, CASES[name], cap) if args.slicing else quality(args, name, CASES[name], cap)
        partial.write_text(json.dumps(report, indent=1, default=float))  # what is done so far
    print(json.dumps(report, indent=1, default=float))
    print()
    print(markdown(report))


if __name__ == "__main__":
    main()
