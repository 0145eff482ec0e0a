#!/usr/bin/env python3
"""qstage against NVIDIA cuTensorNet on the GPU: time per amplitude, each on its own path and both on
qstage's path, with the cgemm ceiling measured in the same run.

  python3 bench/cutn_bench.py run --qstage Q --bench QB --work /tmp/cutnb [--cases medium,big,n53m20]
  python3 bench/cutn_bench.py pack [--with-cutensor]     # here: the wheels for the GPU machine

Cases (complex64; times per amplitude):
  medium  tn_bench's medium (6 x 9 grid, 10 cycles, seed 1; 16 amplitudes for qstage, budget 40GiB)
  big     tn_bench's big (5 x 8 grid, 12 cycles, seed 1; budget 12GiB, so qstage slices)
  wide    8 x 8 grid (64 qubits), 8 cycles, seed 1; 4 amplitudes, budget 12GiB (about 1e11 flops each)
  deep    6 x 6 grid (36 qubits), 14 cycles, seed 1: a 2^35-value intermediate on the unsliced path,
          so tn.path is capped at 2^28 and ONE SLICE is timed as for n53m20 (cuTensorNet, given
          the whole network and tn.plan's sliced modes, asked for 192 GiB of workspace: not understood)
  n53m20  the qsim file circuit_n53_m20_s0_e0_pABCDCDAB.qsim (tracked in tests/data/circuits, so it
          travels), one amplitude (all zeros), tn.path capped at 2^30 elements (8 GiB, --cap-log2),
          tn.plan's default budget (a third of the device: tn.contract holds 3 arenas at once; an
          arena over that fails on the H100): far too many flops for a whole amplitude,
          so ONE SLICE is timed: the network with the sliced modes fixed to 0 is written as a
          generic network (JSON + HDF5 tensors) and qstage contracts it (tn.build, tn.path import
          of the same path, tn.plan, tn.contract); time per amplitude = time per slice x slices.
  small   4 x 5 grid, 10 cycles; small_sliced the same capped at 2^13 and timed as one slice;
          small_plan_sliced the same sliced by tn.plan (budget 512KiB) (CPU checks, see below)
What is measured, per case:
  qstage    `qstage run` of tn.build, tn.path ({seed: 1}, tn.path's default budget, which fits the
            predicted contraction time; or max_seconds: --path-seconds; cap as above; --path-params adds
            JSON), tn.plan (budget), tn.contract on --device. Seconds from each step's
            qstage.wall_seconds attribute: planning = tn.path + tn.plan. Per amplitude: tn.contract's
            batch loop / amplitudes (the manifest's loop_seconds: the step's setup, uploading the
            inputs, left out as cuTensorNet's warm contractions leave out its setup; time_steps:
            false, so no step waits for the device), the best of --repeats warm tn.contract steps
            that follow a cold one in the same run (kernels loaded, libraries initialized, as for
            cuTensorNet's warm contractions; the cold one is reported too), and the cold one with
            its setup ("with setup"). Per slice (n53m20): the same of the one-slice network.
            "with planning" = planning + tn.contract's whole time / amplitudes (tn.build's time is
            left out on both sides); "with planning, whole steps" counts each step to its manifest
            entry (its output written and committed), which wall_seconds leaves out. A second tn.contract of the same plan with time_steps: true
            gives the step profile (step_seconds by how each step runs, beside tn.plan's prediction).
            The path cuTensorNet follows is the one tn.plan executes (its steps' (a, b), which may be
            a reconfigured path) and its sliced modes.
  cuTensorNet  cuquantum.tensornet.Network in the interleaved format (operands as torch complex64
            tensors on the GPU, integer mode labels), options --cutn-options (JSON for NetworkOptions):
            own path: Network(...).contract_path(optimize=--cutn-optimize JSON, default {seed: 1}) timed
            (planning), then contract() once cold and --repeats times warm; on qstage's path:
            contract_path(optimize={'path': linear path, 'slicing': [(mode, extent), ...]}), the same.
            Each Network runs in a process of its own (`cutn_bench.py peer JOB`), killed after
            --peer-timeout seconds and then reported as no result, so that one contraction that
            runs long does not cost the other cases' results. Per amplitude: the best warm contraction. "with planning": Network() + contract_path + the
            cold contraction, plus qstage's planning on qstage's path (the path is qstage's work).
            Sliced networks with more than --max-slices slices contract slices range(--max-slices) and
            scale by num_slices (marked "extrapolated"). n53m20's "own path" is on the whole network
            (cuTensorNet slices to its memory limit); "qstage's path" is the one-slice network.
            Flops: cuTensorNet's opt_cost counts 2 real flops per complex multiply-add; x 4 gives this
            project's 8 per complex multiply-add (docs/benchmarks.md).
  ceiling   qstage_bench ceilings --device cuda --m 4096 --n 4096 --k 4096: gemm_complex64.fp32_TFLOPs
Values are checked: cuTensorNet's amplitude (or slice value) against qstage's (relative difference).
Prints one JSON object and a markdown table.

CPU checks (this machine has no GPU): `run --device cpu --qstage-only --cases small,small_sliced
--verify-slices` runs everything but cuTensorNet, and for small_sliced contracts every slice's
network with qstage and checks their sum against qstage's own sliced contraction of the amplitude.

------------------------------------------------------------------------------------------ transfer
cuTensorNet is not on the GPU machine and it cannot download (../shared/notes.md, "cuTensorNet on
the GPU machine"). Wheels for its Python 3.12: cuquantum-python-cu13 26.9.0 (10.6 MB),
cutensornet-cu13 2.14.0 (3.5 MB), nvmath-python 1.0.0 (5.3 MB), cutensor-cu13 2.8.1 (210.5 MB: its
libcutensor.so.2 is 323 MB). cuda-bindings, cuda-core, cuda-pathfinder, cupy and numpy are there
already; custatevec, cudensitymat, cupauliprop and custabilizer are not needed (the bindings load
each library on first use). One call carries 64 MiB at most (tree + carried paths), so
libcutensor.so.2 goes as xz -9e (about 182 MB) split into parts, one part per call.

1. Here, once (writes into .whl/cutn, which .gitignore's /.whl/ ignores):
       python3 bench/cutn_bench.py pack --with-cutensor
   -> .whl/cutn/base/  the three small wheels and libcutensor.so.2.sha256 (19.4 MB)
      .whl/cutn/p1 .. p3/  libcutensor.so.2.xz.partNN, 58 MiB at most each (--part-mb); a call
                           carries one of them and the tracked tree (about 5 MiB: 60 MiB parts
                           no longer fit)
   Without --with-cutensor it fetches only the small wheels and prints what it would do.
   Also have .gpu/ ready as for tn_bench (docs/benchmarks.md, "How to reproduce"); .gpu/ plus
   .whl/cutn/base plus the tree must stay under 64 MiB (du -sh .gpu .whl/cutn/base). If they do
   not, send base ahead like a part (carry [".whl/cutn/base"], command "mkdir -p /tmp/cutn &&
   cp -r .whl/cutn/base /tmp/cutn/") and carry only .gpu later: the cutn case falls back to
   /tmp/cutn/base.
2. On the GPU machine (the device tool's `run`, kind nvidia-h100-x1), calls back to back (a machine
   is given back 30 s after a call, and /tmp goes with it), one part per call, N = 1, 2, 3:
       run(carry=[".whl/cutn/pN"], timeout_s=300,
           command="mkdir -p /tmp/cutn && cp .whl/cutn/pN/libcutensor.so.2.xz.part* /tmp/cutn/ && ls -l /tmp/cutn")
   then one case per call (each must end within the 600 s limit), carry [".gpu", ".whl/cutn/base"]:
       run(carry=[".gpu", ".whl/cutn/base"], timeout_s=600, command="export PYTHONUNBUFFERED=1
           OMP_NUM_THREADS=16; bash bench/gpu_run.sh cutn --cases medium --work /tmp/cutnb 2>&1 |
           tee $OUT/cutn-medium.txt")
   and the same with --cases big, then --cases n53m20. The first cutn call joins the parts, checks
   libcutensor.so.2's sha256, installs the wheels with `pip install --no-index --no-deps --target
   /tmp/cutn-site` (later calls on the same machine reuse it), sets PYTHONPATH and LD_LIBRARY_PATH
   (/tmp/cutn-site/cuquantum/lib, /tmp/cutn-site/cutensor/lib, torch's nvidia/cu13/lib) and runs
   `python3 bench/cutn_bench.py run ...`. A fresh machine has no /tmp/cutn: send the parts again.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from qstage_runs import h5attrs, run_spec, run_with_timeout, spec_text, ssa_to_linear

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent

CASES = {
    "medium": {"build": {"random": {"rows": 6, "cols": 9, "cycles": 10, "seed": 1},
                         "random_bitstrings": {"count": 16, "seed": 1}}, "budget": "40GiB"},
    "big": {"build": {"random": {"rows": 5, "cols": 8, "cycles": 12, "seed": 1}}, "budget": "12GiB"},
    # other sizes and depths: a wide shallow circuit and a narrow deep one (compute-bound, sliced)
    "wide": {"build": {"random": {"rows": 8, "cols": 8, "cycles": 8, "seed": 1},
                       "random_bitstrings": {"count": 4, "seed": 1}}, "budget": "12GiB"},
    "deep": {"build": {"random": {"rows": 6, "cols": 6, "cycles": 14, "seed": 1}}, "budget": None, "cap": 28,
             "per_slice": True},
    # budget None: tn.plan's default, what each of tn.contract's 3 slots can have of the device
    "n53m20": {"build": {"circuit": "{circuits}/circuit_n53_m20_s0_e0_pABCDCDAB.qsim"}, "budget": None,
               "cap": 30, "per_slice": True},
    "small": {"build": {"random": {"rows": 4, "cols": 5, "cycles": 10, "seed": 1}}, "budget": "1GiB"},
    # a CPU check of the one-slice construction: the budget makes even the old tn.plan slice
    "small_sliced": {"build": {"random": {"rows": 4, "cols": 5, "cycles": 10, "seed": 1}}, "budget": "512KiB",
                     "cap": 13, "per_slice": True},
    # the same budget, whole amplitudes: tn.plan's slices, cuTensorNet given them as its slicing
    "small_plan_sliced": {"build": {"random": {"rows": 4, "cols": 5, "cycles": 10, "seed": 1}}, "budget": "512KiB"},
}

WHEELS = ["cuquantum-python-cu13==26.9.0", "cutensornet-cu13==2.14.0", "nvmath-python==1.0.0"]
CUTENSOR = "cutensor-cu13==2.8.1"
PIP_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
                "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                "--platform", "manylinux1_x86_64"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def size_string(log2_elements, element_bytes=8):
    b = int(log2_elements) + int(math.log2(element_bytes))
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= shift:
            return f"{2 ** (b - shift)}{unit}"
    return str(2 ** b)


# ------------------------------------------------------------------------------------ pack (here)
def pack(args):
    dest = Path(args.dest)
    base = dest / "base"
    (base / "wheels").mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps", *PIP_PLATFORM]
    for w in WHEELS:
        log(f"pip download {w}")
        subprocess.run(pip + ["-d", str(base / "wheels"), w], check=True)
    for w in sorted((base / "wheels").glob("*.whl")):
        with zipfile.ZipFile(w) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            needs = [line.split(":", 1)[1].strip() for line in z.read(meta).decode().splitlines()
                     if line.startswith("Requires-Dist:") and "extra ==" not in line]
        log(f"  {w.name}: {w.stat().st_size / 1e6:.1f} MB; needs {', '.join(needs)}")
    xz = ["xz", "-9e", f"-T{args.xz_threads}", "-c"]
    if not args.with_cutensor:
        print(f"dry run: would download {CUTENSOR} (210.5 MB) to {args.tmp}, then\n"
              f"  unzip -p {args.tmp}/cutensor_cu13-*.whl cutensor/lib/libcutensor.so.2 > {args.tmp}/libcutensor.so.2\n"
              f"  sha256sum libcutensor.so.2 > {base}/libcutensor.so.2.sha256\n"
              f"  {' '.join(xz)} {args.tmp}/libcutensor.so.2 | split -b {args.part_mb}M -d -a 2 - "
              f"{args.tmp}/libcutensor.so.2.xz.part\n"
              f"  move part NN into {dest}/pN+1/ (one folder per call), and delete {args.tmp}")
        return
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    subprocess.run(pip + ["-d", str(tmp), CUTENSOR], check=True)
    pack_cutensor(next(tmp.glob("cutensor_cu13-*.whl")), dest, tmp, args.part_mb, args.xz_threads)


def pack_cutensor(wheel, dest, tmp, part_mb, xz_threads):
    """libcutensor.so.2 out of the cutensor wheel: its sha256 into dest/base, xz -9e, split into parts
    of part_mb MiB, part i into dest/p<i>/; tmp (holding the wheel) is removed."""
    base = dest / "base"
    lib = tmp / "libcutensor.so.2"
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z, open(lib, "wb") as f:
        name = next(n for n in z.namelist() if n.endswith("lib/libcutensor.so.2"))
        with z.open(name) as src:
            for chunk in iter(lambda: src.read(1 << 24), b""):
                h.update(chunk)
                f.write(chunk)
    (base / "libcutensor.so.2.sha256").write_text(f"{h.hexdigest()}  libcutensor.so.2\n")
    log(f"xz -9e of {lib.stat().st_size / 1e6:.0f} MB (minutes)")
    with open(tmp / "libcutensor.so.2.xz", "wb") as out:
        subprocess.run(["xz", "-9e", f"-T{xz_threads}", "-c", str(lib)], stdout=out, check=True)
    subprocess.run(["split", "-b", f"{part_mb}M", "-d", "-a", "2", str(tmp / "libcutensor.so.2.xz"),
                    str(tmp / "libcutensor.so.2.xz.part")], check=True)
    for old in dest.glob("p[0-9]*"):
        shutil.rmtree(old)
    parts = sorted(tmp.glob("libcutensor.so.2.xz.part*"))
    for i, part in enumerate(parts, 1):
        (dest / f"p{i}").mkdir()
        shutil.move(str(part), dest / f"p{i}" / part.name)
    shutil.rmtree(tmp)
    sizes = ", ".join(f"p{i} {(dest / f'p{i}' / p.name).stat().st_size / 2**20:.1f} MiB" for i, p in enumerate(parts, 1))
    print(f"{len(parts)} parts ({sizes}); base {sum(f.stat().st_size for f in base.rglob('*') if f.is_file()) / 2**20:.1f} MiB")


# ------------------------------------------------------------------------------------ qstage side
def qstage_run(args, steps, run_dir):
    return run_spec(args.qstage, spec_text(f"cutnbench-{run_dir.name}", steps), run_dir, args.device, args.device_memory)


def wall(path):
    return float(h5attrs(path)["qstage.wall_seconds"])


def load_network(out):
    """The network JSON and its tensors (projections set to the first bitstring), shaped."""
    import h5py
    import numpy as np
    with h5py.File(out / "net.h5") as f:
        net = json.loads(bytes(f["network"][()]).decode())
        tensors = [f["tensors"][f"t{i:06d}"][()] for i in range(len(net["inputs"]))]
        bits = f["bitstrings"][0] if "bitstrings" in f else None
    for t, q in net.get("projections", []):
        tensors[t] = np.eye(2, dtype=tensors[t].dtype)[int(bits[q]) if bits is not None else 0]
    sizes = {int(k): int(v) for k, v in net["size_dict"].items()}
    net["size_dict"] = sizes
    shaped = [np.asarray(t).reshape([sizes[m] for m in modes]) for t, modes in zip(tensors, net["inputs"])]
    return net, shaped


def executed_path(out, plan_id="plan"):
    """The path tn.plan executes: its steps' SSA pairs and sliced modes."""
    import h5py
    with h5py.File(out / f"{plan_id}.h5") as f:
        planned = json.loads(bytes(f["plan"][()]).decode())
    return [(int(s["a"]), int(s["b"])) for s in planned["steps"]], [int(m) for m in planned["sliced"]], planned


def slice_values(sliced, sizes, index):
    """Slice number -> value of each sliced mode (the first sliced mode is the most significant)."""
    vals = []
    for m in reversed(sliced):
        vals.append(index % sizes[m])
        index //= sizes[m]
    return dict(zip(reversed(sliced), vals))


def sub_network(net, tensors, fixed):
    """The network with the modes in `fixed` set to the given values: removed from every tensor,
    except that a tensor left with no mode keeps its last one with extent 1 (no scalar operands)."""
    import numpy as np
    inputs, data, kept = [], [], set()
    for modes, t in zip(net["inputs"], tensors):
        keep = [m for m in modes if m not in fixed]
        if modes and not keep:
            keep = [modes[-1]]
            kept.add(modes[-1])
        idx = tuple(slice(fixed[m], fixed[m] + 1) if m in fixed and m in keep else fixed[m] if m in fixed
                    else slice(None) for m in modes)
        inputs.append(keep)
        data.append(np.ascontiguousarray(t[idx]))
    sizes = {m: (1 if m in kept else e) for m, e in net["size_dict"].items() if m not in fixed or m in kept}
    return {"inputs": inputs, "output": net["output"], "size_dict": sizes}, data


def write_network(path_json, path_h5, sub, data):
    import h5py
    import numpy as np
    j = {"inputs": [[str(m) for m in t] for t in sub["inputs"]], "output": [str(m) for m in sub["output"]],
         "size_dict": {str(m): e for m, e in sub["size_dict"].items()}}
    path_json.write_text(json.dumps(j))
    with h5py.File(path_h5, "w") as f:
        for i, t in enumerate(data):
            f.create_dataset(f"t{i}", data=np.asarray(t, dtype=np.complex64))


def path_params(args, cap):
    p = {"seed": 1} if args.path_seconds is None else {"max_seconds": args.path_seconds, "seed": 1}
    if cap is not None:
        p["max_intermediate"] = size_string(cap)
    p.update(json.loads(args.path_params) if args.path_params else {})
    return p


def step_profile(out, contraction):
    """Where a contraction's time went: tn.contract's step_seconds (its first work item, timed step
    by step, each step its own launch) beside tn.plan's predicted_seconds, summed by how each step
    runs and by size (small: under 64 KiB moved, the steps a run chains many a launch; their times
    here include a launch and a wait each), and the slowest looped steps against their prediction;
    the large steps furthest above their roofline (step_bytes and step_roofline_seconds)."""
    import h5py
    with h5py.File(out / contraction) as f:
        measured = [float(x) for x in f["step_seconds"][()]] if "step_seconds" in f else []
        moved = [int(x) for x in f["step_bytes"][()]] if "step_bytes" in f else []
        roofline = [float(x) for x in f["step_roofline_seconds"][()]] if "step_roofline_seconds" in f else []
    with h5py.File(out / "plan.h5") as f:
        steps = json.loads(bytes(f["plan"][()]).decode())["steps"]
        predicted = [float(st["predicted_seconds"]) for st in json.loads(bytes(f["prediction"][()]).decode())["steps"]]
    if len(measured) != len(steps):
        return None
    kinds = {}
    for st, t, p in zip(steps, measured, predicted):
        kind = "looped" if st["looped"] else "packed" if st["packed"] else "in place"
        k = kinds.setdefault(kind, {"steps": 0, "measured_seconds": 0.0, "predicted_seconds": 0.0})
        k["steps"] += 1
        k["measured_seconds"] += t
        k["predicted_seconds"] += p
    looped = sorted(((t, st, p) for st, t, p in zip(steps, measured, predicted) if st["looped"]), key=lambda x: -x[0])[:8]
    slowest = [{"m": st["m"], "n": st["n"], "k": st["k"], "loops": st["loops"], "measured_seconds": t,
                "predicted_seconds": p} for t, st, p in looped]
    report = {"by_kind": kinds, "slowest_looped": slowest}
    if len(moved) == len(steps) and len(roofline) == len(steps):
        sizes = {}
        for b, t, p, r in zip(moved, measured, predicted, roofline):
            k = sizes.setdefault("small" if b < 64 * 1024 else "large",
                                 {"steps": 0, "measured_seconds": 0.0, "predicted_seconds": 0.0, "roofline_seconds": 0.0})
            k["steps"] += 1
            k["measured_seconds"] += t
            k["predicted_seconds"] += p
            k["roofline_seconds"] += r
        report["by_size"] = sizes
        large = sorted((i for i, b in enumerate(moved) if b >= 64 * 1024), key=lambda i: roofline[i] - measured[i])[:12]
        report["furthest_from_roofline"] = [
            {"step": i, "m": steps[i]["m"], "n": steps[i]["n"], "k": steps[i]["k"], "loops": steps[i]["loops"],
             "kind": "looped" if steps[i]["looped"] else "packed" if steps[i]["packed"] else "in place",
             "bytes": moved[i], "measured_seconds": measured[i], "roofline_seconds": roofline[i]} for i in large]
    return report


def contract_steps(args, name):
    """tn.contract of the plan once cold (`name`: its outputs are the values checked) and --repeats
    times warm (`name`_w1, ...): the same process, so kernels are loaded and libraries initialized,
    as for cuTensorNet's warm contractions. time_steps: false, so no step waits for the device."""
    return [(name if i == 0 else f"{name}_w{i}", "tn.contract", {"network": "net", "plan": "plan"}, {"time_steps": False})
            for i in range(1 + args.repeats)]


def warm_loop_seconds(args, run_dir, name):
    """(cold, best warm) loop_seconds of contract_steps' runs: each tn.contract's batch loop, without
    its setup (the inputs uploaded)."""
    steps = json.loads((run_dir / "manifest.json").read_text())["steps"]
    loops = [float(steps[name if i == 0 else f"{name}_w{i}"]["metrics"]["loop_seconds"]) for i in range(1 + args.repeats)]
    return loops[0], min(loops[1:]) if len(loops) > 1 else loops[0]


def qstage_case(args, name, case):
    work = Path(args.work)
    cap = args.cap_log2 if (case.get("cap") is not None and args.cap_log2 is not None) else case.get("cap")
    build = json.loads(json.dumps(case["build"]).replace("{circuits}", str(Path(args.circuits).resolve())))
    budget = args.budget or case["budget"]
    plan_params = {**({"budget": budget} if budget else {}), "precision": "complex64", "max_slices": 1e15}
    steps = [("net", "tn.build", None, build),
             ("path", "tn.path", {"network": "net"}, path_params(args, cap)),
             ("plan", "tn.plan", {"network": "net", "path": "path"}, plan_params)]
    run_dir = work / name
    res = {"cap_log2": cap, "budget": budget or "tn.plan's default", "path_params": steps[1][3]}
    unfused_params = {**plan_params, "fuse_gates": False}
    if not case.get("per_slice"):
        steps += contract_steps(args, "amps")
        steps.append(("profile", "tn.contract", {"network": "net", "plan": "plan"}, {}))
        if args.also_unfused:  # the same path planned without gate fusion, contracted in the same run
            steps.append(("plan_unfused", "tn.plan", {"network": "net", "path": "path"}, unfused_params))
            steps.append(("amps_unfused", "tn.contract", {"network": "net", "plan": "plan_unfused"}, {"time_steps": False}))
    elif args.also_unfused:  # (its one slice then follows the unfused plan's path)
        steps.append(("plan_unfused", "tn.plan", {"network": "net", "path": "path"}, unfused_params))
    log(f"{name}: qstage {' -> '.join(s[1] for s in steps)} on {args.device}")
    err = qstage_run(args, steps, run_dir)
    out = run_dir / "outputs"
    pa, pl = h5attrs(out / "path.h5"), h5attrs(out / "plan.h5")
    ssa, sliced, planned = executed_path(out)
    res["path"] = {k: json.loads(pa["cost"]).get(k) for k in ("log10_C_t", "log2_C_s", "flops_total", "slices",
                                                                 "log10_C_t_total", "C_t_total_with_reuse")}
    res["path_log"] = [l.split("result: ", 1)[1] for l in err.splitlines() if "'path' result" in l]
    res["plan_log"] = [l.split("result: ", 1)[1] for l in err.splitlines() if "'plan' result" in l]
    res["slices"] = int(pl["slices"])
    res["sliced"] = sliced
    res["arena_bytes"] = int(pl["arena_bytes"])
    res["fused_gates"] = int(pl.get("fused_gates", 0))
    res["flops_total"] = float(planned["cost"]["flops_total"])  # all slices, 8 per complex multiply-add
    res["planning_seconds"] = wall(out / "path.h5") + wall(out / "plan.h5")
    res["path_seconds"], res["plan_seconds"] = wall(out / "path.h5"), wall(out / "plan.h5")
    # The steps whole (the manifest's seconds: also the stage writing its output, the commit and the
    # manifest, which the wall_seconds attribute, taken as the output is annotated, leaves out)
    manifest_steps = json.loads((run_dir / "manifest.json").read_text())["steps"]
    res["whole_step_seconds"] = {k: float(manifest_steps[k]["metrics"]["seconds"]) for k in ("path", "plan")}
    net, tensors = load_network(out)
    if not case.get("per_slice"):
        import h5py
        with h5py.File(out / "amps.h5") as f:
            values = f["amplitudes"][()].reshape(-1)
        count = len(values)  # one amplitude per bitstring (no open qubits)
        contract = wall(out / "amps.h5")
        metrics = json.loads((run_dir / "manifest.json").read_text())["steps"]["amps"]["metrics"]
        cold, loop = warm_loop_seconds(args, run_dir, "amps")
        res["qstage"] = {"amplitudes": count, "contract_seconds": contract, "setup_seconds": float(metrics["setup_seconds"]),
                         # (the step's parts outside its loop: before the engine, the output written)
                         "prepare_seconds": float(metrics.get("prepare_seconds", "nan")),
                         "finalize_seconds": float(metrics["finalize_seconds"]),
                         "loop_seconds": loop, "cold_loop_seconds": cold, "seconds_per_amplitude": loop / count,
                         "seconds_per_amplitude_with_setup": contract / count,
                         "seconds_per_amplitude_with_planning": res["planning_seconds"] + contract / count,
                         "seconds_per_amplitude_with_planning_whole_steps":
                             res["whole_step_seconds"]["path"] + res["whole_step_seconds"]["plan"] +
                             float(metrics["seconds"]) / count,
                         "tflops": res["flops_total"] / (loop / count) / 1e12,
                         "value": [float(values[0].real), float(values[0].imag)],
                         "step_profile": step_profile(out, "profile.h5")}
        if args.also_unfused:
            res["qstage_unfused"] = unfused_figures(run_dir, out, "plan_unfused", "amps_unfused", count, values[0])
        return res, net, tensors, ssa, sliced, None
    # One slice: the network with the sliced modes fixed to 0, the same path, planned and contracted.
    fixed = slice_values(sliced, net["size_dict"], 0)
    sub, data = sub_network(net, tensors, fixed)
    write_network(work / f"{name}-slice0.json", work / f"{name}-slice0.h5", sub, data)
    (work / f"{name}-slice0-path.json").write_text(json.dumps([list(p) for p in ssa]))
    sdir = work / f"{name}-slice0"
    ssteps = [("net", "tn.build", None, {"network": str(work / f"{name}-slice0.json"),
                                          "tensors": str(work / f"{name}-slice0.h5")}),
              ("path", "tn.path", {"network": "net"}, {"import": str(work / f"{name}-slice0-path.json"), "format": "ssa"}),
              ("plan", "tn.plan", {"network": "net", "path": "path"}, plan_params),
              *contract_steps(args, "value"),
              ("profile", "tn.contract", {"network": "net", "plan": "plan"}, {})]
    if args.also_unfused:  # the slice again along the whole network's unfused plan (the same sliced modes)
        ussa, usliced, _ = executed_path(out, "plan_unfused")
        assert usliced == sliced, (usliced, sliced)
        (work / f"{name}-slice0-path-unfused.json").write_text(json.dumps([list(p) for p in ussa]))
        ssteps += [("path_unfused", "tn.path", {"network": "net"},
                    {"import": str(work / f"{name}-slice0-path-unfused.json"), "format": "ssa"}),
                   ("plan_unfused", "tn.plan", {"network": "net", "path": "path_unfused"}, unfused_params),
                   ("value_unfused", "tn.contract", {"network": "net", "plan": "plan_unfused"}, {"time_steps": False})]
    log(f"{name}: qstage, one slice of {res['slices']} ({len(sliced)} modes fixed)")
    qstage_run(args, ssteps, sdir)
    sout = sdir / "outputs"
    import h5py
    with h5py.File(sout / "value.h5") as f:
        v = complex(f["value"][()].reshape(-1)[0])
    spl = h5attrs(sout / "plan.h5")
    sssa, ssliced, splanned = executed_path(sout)  # tn.plan may slice the slice further
    cold, per_slice = warm_loop_seconds(args, sdir, "value")
    slice_flops = float(splanned["cost"]["flops_total"])
    res["slice_plan"] = {"slices": int(spl["slices"]), "arena_bytes": int(spl["arena_bytes"]), "flops": slice_flops}
    res["qstage"] = {"slice_seconds": per_slice, "cold_slice_seconds": cold,
                     "slice_seconds_with_setup": wall(sout / "value.h5"),
                     "seconds_per_amplitude": per_slice * res["slices"],
                     "seconds_per_amplitude_with_planning": res["planning_seconds"] + per_slice * res["slices"],
                     "tflops": slice_flops / per_slice / 1e12, "slice_value": [v.real, v.imag],
                     "extrapolated": res["slices"] > 1, "step_profile": step_profile(sout, "profile.h5"),
                     "fused_gates": int(spl.get("fused_gates", 0))}
    if args.also_unfused:
        res["qstage_unfused"] = unfused_figures(sdir, sout, "plan_unfused", "value_unfused", 1, v)
    if args.verify_slices:
        res["verify"] = verify_slices(args, name, case, net, tensors, ssa, sliced, steps, run_dir)
    return res, net, tensors, ssa, sliced, (sub, data, sssa, ssliced)


def unfused_figures(run_dir, out, plan_id, contract_id, count, fused_value):
    """The same path planned with fuse_gates: false and contracted in the same run: time per amplitude
    (or slice), the steps it ran and its value against the fused plan's."""
    import h5py
    with h5py.File(out / f"{contract_id}.h5") as f:
        v = complex(f["amplitudes" if "amplitudes" in f else "value"][()].reshape(-1)[0])
    loop = float(json.loads((run_dir / "manifest.json").read_text())["steps"][contract_id]["metrics"]["loop_seconds"])
    _, _, planned = executed_path(out, plan_id)
    return {"seconds": loop / count, "steps": len(planned["steps"]),
            "relative_difference_to_fused": abs(v - complex(fused_value)) / max(abs(v), 1e-300)}


def verify_slices(args, name, case, net, tensors, ssa, sliced, steps, run_dir):
    """CPU check of the one-slice construction: the sum of every slice's network, each contracted by
    qstage, equals qstage's own sliced contraction of the amplitude."""
    import h5py
    n = math.prod(net["size_dict"][m] for m in sliced)
    if n > 64:
        return {"skipped": f"{n} slices (more than 64)"}
    qstage_run(args, steps + [("amps", "tn.contract", {"network": "net", "plan": "plan"}, {})], run_dir)
    with h5py.File(run_dir / "outputs" / "amps.h5") as f:
        whole = complex(f["amplitudes"][()].reshape(-1)[0])
    work = Path(args.work)
    total = 0
    (work / f"{name}-v-path.json").write_text(json.dumps([list(p) for p in ssa]))
    for s in range(n):
        sub, data = sub_network(net, tensors, slice_values(sliced, net["size_dict"], s))
        write_network(work / f"{name}-v.json", work / f"{name}-v.h5", sub, data)
        d = work / f"{name}-v{s}"
        qstage_run(args, [("net", "tn.build", None, {"network": str(work / f"{name}-v.json"), "tensors": str(work / f"{name}-v.h5")}),
                          ("path", "tn.path", {"network": "net"}, {"import": str(work / f"{name}-v-path.json"), "format": "ssa"}),
                          ("plan", "tn.plan", {"network": "net", "path": "path"}, steps[2][3]),
                          ("value", "tn.contract", {"network": "net", "plan": "plan"}, {})], d)
        with h5py.File(d / "outputs" / "value.h5") as f:
            total += complex(f["value"][()].reshape(-1)[0])
        shutil.rmtree(d)
    return {"slices": n, "sum_of_slices": [total.real, total.imag], "amplitude": [whole.real, whole.imag],
            "relative_difference": abs(total - whole) / max(abs(whole), 1e-300)}


# ------------------------------------------------------------------------------------ cuTensorNet
def import_cutn():
    try:
        import cuquantum
        from cuquantum import tensornet as tn
    except Exception as e:  # noqa: BLE001
        sys.exit("cuquantum.tensornet does not import ({}: {}).\nOn the GPU machine: send the wheels and "
                 "libcutensor.so.2 as this script's docstring says and run through `bash bench/gpu_run.sh cutn`, "
                 "which installs them into /tmp/cutn-site and sets PYTHONPATH and LD_LIBRARY_PATH (cuquantum/lib, "
                 "cutensor/lib, torch's nvidia/cu13/lib). PYTHONPATH={} LD_LIBRARY_PATH={}".format(
                     type(e).__name__, e, os.environ.get("PYTHONPATH", ""), os.environ.get("LD_LIBRARY_PATH", "")))
    return cuquantum, tn


def cutn_contract(job, tn, net, tensors):
    """One Network: contract_path(optimize) timed, contract once cold and `repeats` times warm."""
    import numpy as np
    optimize, max_slices = job["optimize"], job["max_slices"]
    if job["device"] == "cpu":  # numpy operands (cuTensorNet copies them to the GPU itself; CPU checks)
        ops = [np.ascontiguousarray(t.astype(np.complex64)) for t in tensors]
        sync = lambda: None  # noqa: E731
    else:
        import torch
        ops = [torch.from_numpy(np.ascontiguousarray(t.astype(np.complex64))).cuda() for t in tensors]
        sync = torch.cuda.synchronize
    sync()
    interleaved = []
    for op, modes in zip(ops, net["inputs"]):
        interleaved += [op, [int(m) for m in modes]]
    interleaved.append([int(m) for m in net["output"]])
    options = json.loads(job["cutn_options"]) if job["cutn_options"] else None
    t0 = time.perf_counter()
    network = tn.Network(*interleaved, options=options)
    setup = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        _, info = network.contract_path(optimize=optimize)
        path_seconds = time.perf_counter() - t0
        num_slices = int(info.num_slices)
        timed = num_slices if num_slices <= max_slices else max_slices
        slices = None if timed == num_slices else range(timed)
        times = []
        value = None
        for i in range(1 + job["repeats"]):
            sync()
            t0 = time.perf_counter()
            out = network.contract(slices=slices)
            sync()
            times.append(time.perf_counter() - t0)
            if value is None:
                value = complex(out.reshape(-1)[0].item())
        scale = num_slices / timed
        warm = min(times[1:]) if len(times) > 1 else times[0]
        res = {"setup_seconds": setup, "path_seconds": path_seconds, "num_slices": num_slices, "slices_timed": timed,
               "extrapolated": timed != num_slices, "first_contract_seconds": times[0] * scale,
               "warm_seconds": warm * scale, "warm_runs": [t * scale for t in times[1:]],
               "opt_cost_flops_2_per_cmadd": float(info.opt_cost),
               "flops_total_8_per_cmadd": 4.0 * float(info.opt_cost),
               "largest_intermediate_log2": math.log2(max(float(info.largest_intermediate), 1)),
               "value": [value.real, value.imag]}
        res["seconds_per_amplitude"] = res["warm_seconds"]
        res["seconds_per_amplitude_with_planning"] = setup + path_seconds + res["first_contract_seconds"]
        res["tflops"] = res["flops_total_8_per_cmadd"] / res["warm_seconds"] / 1e12
        return res
    finally:
        network.free()


def cutn_peer(args, net, tensors, optimize, max_slices, label):
    """cutn_contract in a process of its own (`cutn_bench.py peer JOB`), killed with its process group
    after --peer-timeout seconds: its result, or {"timed_out": seconds} or {"failed": message}. A
    contraction that runs past the limit (cuTensorNet's own path on n53m20 ran over 500 s) leaves
    the other cases' results to the report."""
    import numpy as np
    work = Path(args.work)
    job = {"device": args.device, "repeats": args.repeats, "cutn_options": args.cutn_options, "optimize": optimize,
           "max_slices": max_slices, "network": {k: net[k] for k in ("inputs", "output", "size_dict")},
           "tensors": str(work / f"peer-{label}.npz")}
    np.savez(job["tensors"], *tensors)
    job_file = work / f"peer-{label}.json"
    job_file.write_text(json.dumps(job, default=int))
    try:
        r = run_with_timeout([sys.executable, str(HERE), "peer", str(job_file)], None, args.peer_timeout or None)
    except subprocess.TimeoutExpired:
        log(f"{label}: cuTensorNet gave no result within --peer-timeout {args.peer_timeout:g} s")
        return {"timed_out": args.peer_timeout}
    finally:
        Path(job["tensors"]).unlink(missing_ok=True)
    if r.returncode != 0:
        log(f"{label}: cuTensorNet failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
        return {"failed": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def peer(args):
    """The child side of cutn_peer: one job, its result as the last line of stdout."""
    import numpy as np
    job = json.loads(Path(args.job).read_text())
    _, tn = import_cutn()
    with np.load(job["tensors"]) as f:
        tensors = [f[f"arr_{i}"] for i in range(len(f.files))]
    print(json.dumps(cutn_contract(job, tn, job["network"], tensors), default=float))


def ceilings(args):
    if not args.bench:
        return {}
    r = subprocess.run([args.bench, "ceilings", "--device", args.device, "--m", "4096", "--n", "4096", "--k", "4096"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"qstage_bench failed:\n{r.stderr}")
    return json.loads(r.stdout)


def rel(a, b):
    a, b = complex(*a), complex(*b)
    return abs(a - b) / max(abs(b), 1e-300)


def run(args):
    Path(args.work).mkdir(parents=True, exist_ok=True)
    tn = None
    report = {"device": args.device, "cases": {}}
    if not args.qstage_only:
        cuquantum, tn = import_cutn()
        report["cuquantum"] = getattr(cuquantum, "__version__", "?")
        try:
            from cuquantum.bindings import cutensornet as binding
            report["cutensornet_library"] = binding.get_version()
        except Exception as e:  # noqa: BLE001 - only a label
            report["cutensornet_library"] = f"? ({e})"
        if args.device != "cpu":
            import torch
            report["gpu"] = torch.cuda.get_device_name(0)
    report["ceilings"] = ceilings(args)
    gemm = report["ceilings"].get("gemm_complex64", {}).get("fp32_TFLOPs")
    for name in args.cases.split(","):
        if name not in CASES:
            sys.exit(f"unknown case '{name}'; expected one of {', '.join(CASES)}")
        case = CASES[name]
        res, net, tensors, ssa, sliced, sub = qstage_case(args, name, case)
        q = res["qstage"]
        if gemm:
            q["fraction_of_cgemm"] = q["tflops"] / gemm
        log(f"{name}: qstage {q}")
        if tn is not None:
            optimize = json.loads(args.cutn_optimize) if args.cutn_optimize else {"seed": 1}
            log(f"{name}: cuTensorNet, its own path (optimize={optimize})")
            res["cutn_own_path"] = cutn_peer(args, net, tensors, optimize, args.max_slices, f"{name}-own")
            log(f"{name}: cuTensorNet on qstage's path")
            if sub is None:
                lin = ssa_to_linear(ssa, len(tensors))
                slicing = [(int(m), int(net["size_dict"][m])) for m in sliced]
                res["cutn_qstage_path"] = cutn_peer(args, net, tensors, {"path": lin, "slicing": slicing},
                                                    args.max_slices, f"{name}-ours")
                ref = q["value"]
                r = res["cutn_qstage_path"]
                if "warm_seconds" in r:
                    r["seconds_per_amplitude_with_planning"] += res["planning_seconds"]  # the path is qstage's
            else:  # the one-slice network and the path (and slicing, if any) qstage executed on it
                snet, sdata, sssa, ssliced = sub
                opt = {"path": ssa_to_linear(sssa, len(sdata))}
                if ssliced:
                    opt["slicing"] = [(int(m), int(snet["size_dict"][m])) for m in ssliced]
                res["cutn_qstage_path"] = cutn_peer(args, snet, sdata, opt, 1 << 30, f"{name}-ours")
                ref = q["slice_value"]
                r = res["cutn_qstage_path"]
                if "warm_seconds" in r:
                    r["slice_seconds"] = r["warm_seconds"]
                    r["seconds_per_amplitude"] = r["warm_seconds"] * res["slices"]
                    r["seconds_per_amplitude_with_planning"] = (res["planning_seconds"] + r["setup_seconds"] +
                                                                r["path_seconds"] + r["first_contract_seconds"] * res["slices"])
                    r["tflops"] = r["flops_total_8_per_cmadd"] / r["warm_seconds"] / 1e12
            for key in ("cutn_qstage_path",) + (("cutn_own_path",) if sub is None else ()):
                c = res[key]  # a value summed over some of the slices is no amplitude
                if "warm_seconds" in c:
                    c["relative_difference_vs_qstage"] = None if c["extrapolated"] else rel(c["value"], ref)
            for key in ("cutn_own_path", "cutn_qstage_path"):
                c = res[key]
                if "warm_seconds" not in c:  # (timed out or failed: said so in the report)
                    continue
                if gemm:
                    c["fraction_of_cgemm"] = c["tflops"] / gemm
                c["qstage_speedup"] = c["seconds_per_amplitude"] / q["seconds_per_amplitude"]
                c["qstage_speedup_with_planning"] = (c["seconds_per_amplitude_with_planning"] /
                                                     q["seconds_per_amplitude_with_planning"])
                log(f"{name}: {key} {c}")
        report["cases"][name] = res
    print(json.dumps(report, indent=1, default=float))
    print()
    print(markdown(report))


def markdown(report):
    rows = ["| case | who, path | s / amplitude | with planning | TFLOP/s | of cgemm | qstage faster (x) | "
            "with planning (x) |", "|" + " --- |" * 8]
    f = lambda x, s: "" if x is None else format(x, s)
    for name, r in report["cases"].items():
        q = r["qstage"]
        ext = " (one slice x slices)" if "slice_seconds" in q else ""
        rows.append(f"| {name} | qstage, its path ({r['slices']} slices){ext} | {q['seconds_per_amplitude']:.4g} | "
                    f"{q['seconds_per_amplitude_with_planning']:.4g} | {q['tflops']:.3g} | "
                    f"{f(q.get('fraction_of_cgemm'), '.0%')} | | |")
        if "qstage_unfused" in r:
            u = r["qstage_unfused"]
            rows.append(f"| | qstage, the same path without gate fusion ({u['steps']} steps; fused plan: "
                        f"{r.get('fused_gates')} fewer passes) | {u['seconds']:.4g} | | | | | |")
        for key, label in (("cutn_own_path", "cuTensorNet, its path"), ("cutn_qstage_path", "cuTensorNet, qstage's path")):
            if key not in r:
                continue
            c = r[key]
            if "timed_out" in c:
                rows.append(f"| | {label} | no result within {c['timed_out']:g} s (--peer-timeout) | | | | | |")
            elif "failed" in c:
                rows.append(f"| | {label} | failed: {c['failed']} | | | | | |")
            else:
                n = (f"one slice x {r['slices']}" if "slice_seconds" in c else
                     f"{c['num_slices']} slices{', extrapolated from ' + str(c['slices_timed']) if c['extrapolated'] else ''}")
                rows.append(f"| | {label} ({n}) | "
                            f"{c['seconds_per_amplitude']:.4g} | {c['seconds_per_amplitude_with_planning']:.4g} | "
                            f"{c['tflops']:.3g} | {f(c.get('fraction_of_cgemm'), '.0%')} | {c['qstage_speedup']:.3g} | "
                            f"{c['qstage_speedup_with_planning']:.3g} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the benchmark (GPU machine)")
    r.add_argument("--qstage", required=True)
    r.add_argument("--bench", default="", help="qstage_bench, for the cgemm ceiling (skipped if empty)")
    r.add_argument("--device", default="cuda")
    r.add_argument("--device-memory", default="")
    r.add_argument("--work", default="/tmp/cutnbench")
    r.add_argument("--cases", default="medium,big,n53m20")
    r.add_argument("--circuits", default=str(REPO / "tests" / "data" / "circuits"),
                   help="folder with circuit_n53_m20_s0_e0_pABCDCDAB.qsim (tracked in the repo, so it travels)")
    r.add_argument("--path-seconds", type=float, default=None,
                   help="tn.path's max_seconds (default: none, tn.path's own budget fitted to the job)")
    r.add_argument("--path-params", default="", help="JSON merged into tn.path's params")
    r.add_argument("--cap-log2", type=int, default=None, help="n53m20's cap on the largest intermediate (default 30)")
    r.add_argument("--budget", default="", help="tn.plan's budget for every case (default: the case's; n53m20: "
                                                "tn.plan's default, a third of the device memory)")
    r.add_argument("--cutn-optimize", default="", help="JSON OptimizerOptions for cuTensorNet's own path, e.g. "
                                                        "'{\"samples\": 8}' (default {\"seed\": 1}: the library's defaults, seeded as "
                                                        "tn.path is, so that its path does not change from run to run)")
    r.add_argument("--cutn-options", default="", help="JSON NetworkOptions, e.g. '{\"memory_limit\": \"60GiB\"}'")
    r.add_argument("--max-slices", type=int, default=8, help="cuTensorNet: contract at most this many slices, then "
                                                             "extrapolate to all")
    r.add_argument("--repeats", type=int, default=2, help="warm contractions after the cold one (each tool)")
    r.add_argument("--peer-timeout", type=float, default=0,
                   help="seconds each cuTensorNet contraction (its own process) may take before it is killed and "
                        "reported as no result (default 0: no limit)")
    r.add_argument("--qstage-only", action="store_true", help="skip cuTensorNet (CPU checks)")
    r.add_argument("--also-unfused", action="store_true", help="qstage: also plan the same path with fuse_gates: "
                                                                   "false and time its contraction (qstage_unfused)")
    r.add_argument("--verify-slices", action="store_true", help="per-slice cases: check the sum of all slices (CPU)")
    p = sub.add_parser("pack", help="here: wheels and libcutensor parts for the GPU machine")
    p.add_argument("--dest", default=str(REPO / ".whl" / "cutn"))
    p.add_argument("--with-cutensor", action="store_true", help="also download cutensor-cu13 (210 MB), xz and split")
    p.add_argument("--part-mb", type=int, default=58, help="MiB per part (3 parts; one part + the tracked tree, about 5 MiB, < 64 MiB)")
    p.add_argument("--xz-threads", type=int, default=2)
    p.add_argument("--tmp", default="/tmp/cutn-pack")
    j = sub.add_parser("peer", help="(run's child) one cuTensorNet contraction described by a job file")
    j.add_argument("job")
    args = ap.parse_args()
    if args.command == "pack":
        pack(args)
    elif args.command == "peer":
        peer(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
