#!/usr/bin/env python3
"""Tensor-network contraction benchmark: qstage's tn.contract against the GEMM ceiling measured
in the same run, and side by side with peers on the same network and the same path.

  python3 bench/tn_bench.py --qstage build/qstage --bench build/bench/qstage_bench --device cuda \\
      --work /tmp/tnb [--cases big,medium] [--numpy] [--torch]

Cases (seeded random circuits, Sycamore-style gates on a grid; times are per amplitude):
  big     5 x 8 grid, 12 cycles (40 qubits): about 5e14 flops along our path, sliced to a budget
  medium  6 x 9 grid, 10 cycles (54 qubits): about 6e12 flops, in core (one slice), 4 amplitudes
  medium_ooc  the same, out of core: device budget 256 MiB, a quarter of its largest intermediate
  medium_scratch  the same with a 256 MiB host budget: spilled intermediates in an HDF5 scratch file
  medium_ooc_szx, medium_ooc_q4, medium_ooc_q3  medium_ooc with compress_spilled: szx lossless,
              quantized at 1e-4 and 1e-3 (the result's change is measured against complex128)
  small   4 x 5 grid, 10 cycles: seconds on a laptop CPU (checks the script)
For each case qstage builds the network, finds a path (a fixed number of greedy restarts, so the
path is the same on every machine), plans and contracts it. Peers follow exactly that path:
opt_einsum with the torch backend on the GPU (complex64), and numpy through opt_einsum on the CPU.
Flops are 8 real flops per complex multiply-add. Prints one JSON object.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from qstage_runs import run_spec, ssa_to_linear

CASES = {
    "big": {"grid": (5, 8, 12), "tries": 400, "budget": "12GiB"},
    # Several amplitudes, so the first one's costs (lazy kernel loading, and a sync after every step
    # to time it) are amortized as they are in real runs; the peers are timed warm on one.
    "medium": {"grid": (6, 9, 10), "tries": 200, "budget": "40GiB", "bitstrings": 4},
    # medium out of core: a device budget of a quarter of its largest intermediate (2^27 complex64
    # values, 1 GiB); the larger ones live in pinned host memory. Compared with medium's in-core rate.
    "medium_ooc": {"grid": (6, 9, 10), "tries": 200, "budget": "256MiB", "bitstrings": 4, "in_core": "medium",
                   "plan": "out_of_core: true, host_budget: 48GiB"},
    # The same with a 256 MiB host budget too: the spilled intermediates live in an HDF5 scratch file.
    "medium_scratch": {"grid": (6, 9, 10), "tries": 200, "budget": "256MiB", "bitstrings": 4, "in_core": "medium",
                       "plan": "out_of_core: true, host_budget: 256MiB, scratch: true"},
    # medium_ooc with its spilled intermediates kept as codec streams (tn.contract compress_spilled):
    # lossless (szx, error 0) and quantized at 1e-4 and 1e-3 of each block's range.
    "medium_ooc_szx": {"grid": (6, 9, 10), "tries": 200, "budget": "256MiB", "bitstrings": 4, "in_core": "medium",
                       "plan": "out_of_core: true, host_budget: 48GiB",
                       "contract": "compress_spilled: {pipeline: szx, error: 0}"},
    "medium_ooc_q4": {"grid": (6, 9, 10), "tries": 200, "budget": "256MiB", "bitstrings": 4, "in_core": "medium",
                      "plan": "out_of_core: true, host_budget: 48GiB",
                      "contract": "compress_spilled: {pipeline: quantized, error: 1.0e-4, threshold: 1.0e-4}"},
    "medium_ooc_q3": {"grid": (6, 9, 10), "tries": 200, "budget": "256MiB", "bitstrings": 4, "in_core": "medium",
                      "plan": "out_of_core: true, host_budget: 48GiB",
                      "contract": "compress_spilled: {pipeline: quantized, error: 1.0e-3, threshold: 1.0e-3}"},
    "small": {"grid": (4, 5, 10), "tries": 64, "budget": "1GiB"},  # a smoke test for any machine
}


def qstage_run(args, text, run_dir):
    return run_spec(args.qstage, text, run_dir, args.device, args.device_memory)


def spec_for(name, case, compute="full", precision="complex64"):
    rows, cols, cycles = case["grid"]
    return f"""name: tnbench-{name}
steps:
  - id: net
    stage: tn.build
    params: {{random: {{rows: {rows}, cols: {cols}, cycles: {cycles}, seed: 1}}, random_bitstrings: {{count: {case.get("bitstrings", 1)}, seed: 1}}}}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{max_tries: {case["tries"]}, max_seconds: 600, seed: 1}}
  - id: plan
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{budget: {case["budget"]}, precision: {precision}{", " + case["plan"] if "plan" in case else ""}}}
  - id: amps
    stage: tn.contract
    inputs: {{network: net, plan: plan}}
    params: {{compute: {compute}{", " + case["contract"] if "contract" in case else ""}}}
"""


def attrs(path):
    with h5py.File(path) as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}


def load_network(run_dir):
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        net = json.loads(bytes(f["network"][()]).decode())
        tensors = [f["tensors"][f"t{i:06d}"][()] for i in range(len(net["inputs"]))]
        bits = f["bitstrings"][0] if "bitstrings" in f else None
    for t, q in net.get("projections", []):  # <x_q| follows the (first) bitstring
        tensors[t] = np.eye(2, dtype=tensors[t].dtype)[int(bits[q])]
    with h5py.File(run_dir / "outputs" / "path.h5") as f:
        ssa = f["path"][()].tolist()
    sizes = {int(k): v for k, v in net["size_dict"].items()}
    shaped = [t.reshape([sizes[m] for m in modes]) for t, modes in zip(tensors, net["inputs"])]
    return net, shaped, ssa


def peer_contract(net, tensors, ssa, backend):
    import opt_einsum as oe
    letters = {}
    for modes in net["inputs"] + [net["output"]]:
        for m in modes:
            letters.setdefault(m, oe.get_symbol(len(letters)))
    eq = ",".join("".join(letters[m] for m in t) for t in net["inputs"]) + "->" + "".join(letters[m] for m in net["output"])
    linear = ssa_to_linear(ssa, len(tensors))
    if backend == "torch":
        import torch
        ops = [torch.from_numpy(t.astype(np.complex64)).cuda() for t in tensors]
        oe.contract(eq, *ops, optimize=linear, backend="torch")  # warm-up (cuBLAS handles, caches)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = oe.contract(eq, *ops, optimize=linear, backend="torch")
        torch.cuda.synchronize()
        return time.perf_counter() - t0, complex(out.cpu().numpy().reshape(-1)[0])
    ops = [t.astype(np.complex64) for t in tensors]
    t0 = time.perf_counter()
    out = oe.contract(eq, *ops, optimize=linear, backend="numpy")
    return time.perf_counter() - t0, complex(np.asarray(out).reshape(-1)[0])


def cotengra_path(net, seconds):
    """cotengra's hyper-optimized greedy (kahypar is not installed) on the same network, for
    minimal flops; C_t in multiply-adds and C_s in elements, as tn.path reports them."""
    import math
    import cotengra as ctg
    inputs = [tuple(t) for t in net["inputs"]]
    sizes = {int(k): v for k, v in net["size_dict"].items()}
    t0 = time.perf_counter()
    opt = ctg.HyperOptimizer(methods=["greedy"], max_time=seconds, max_repeats=10**6, progbar=False,
                             parallel=False, minimize="flops")
    tree = opt.search(inputs, tuple(net["output"]), sizes)
    return {"seconds": time.perf_counter() - t0, "log10_C_t": math.log10(tree.contraction_cost()),
            "log2_C_s": float(tree.contraction_width()), "trials": len(opt.scores)}


def ceilings(args):
    r = subprocess.run([args.bench, "ceilings", "--device", args.device, "--m", "4096", "--n", "4096", "--k", "4096"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"qstage_bench failed:\n{r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qstage", required=True)
    ap.add_argument("--bench", required=True, help="qstage_bench, for the cgemm ceiling")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--device-memory", default="")
    ap.add_argument("--work", default="/tmp/tnbench")
    ap.add_argument("--cases", default="big,medium")
    ap.add_argument("--compute", default="", metavar="MODES",
                    help="also contract in these compute modes (comma-separated: tf32, 3xtf32, bf16)")
    ap.add_argument("--torch", action="store_true", help="opt_einsum + torch on the GPU, same path")
    ap.add_argument("--numpy", action="store_true", help="opt_einsum + numpy on the CPU, same path")
    ap.add_argument("--cotengra", type=float, default=0, metavar="SECONDS",
                    help="also search a path with cotengra for this long and compare C_t, C_s")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report = {"ceilings": ceilings(args), "cases": {}}
    gemm = report["ceilings"]["gemm_complex64"]
    modes = ["full"] + [m for m in args.compute.split(",") if m]
    cgemm = {m: gemm.get("fp32_TFLOPs" if m == "full" else f"{m}_TFLOPs", 0) * 1e12 for m in modes}
    for name in args.cases.split(","):
        case = CASES[name]
        res = {"grid": case["grid"]}
        for mode in modes:
            run_dir = work / (name if mode == "full" else f"{name}-{mode}")
            log = qstage_run(args, spec_for(name, case, mode), run_dir)
            out = run_dir / "outputs"
            path, plan, amps = attrs(out / "path.h5"), attrs(out / "plan.h5"), attrs(out / "amps.h5")
            flops = json.loads(path["cost"])["flops_total"]
            with h5py.File(out / "amps.h5") as f:
                value = complex(f["amplitudes"][()].reshape(-1)[0])
                step_seconds = f["step_seconds"][()]
            # over all slices, the invariant steps once (tn.plan's reuse_invariant)
            sliced_flops = float(plan["flops_total"])
            count = case.get("bitstrings", 1)
            wall = float(amps["qstage.wall_seconds"]) / count  # per amplitude, setup included
            metrics = json.loads((run_dir / "manifest.json").read_text())["steps"]["amps"]["metrics"]
            key = "qstage" if mode == "full" else f"qstage_{mode}"
            res["path"] = {k: json.loads(path["cost"])[k] for k in ("log10_C_t", "log2_C_s", "flops_total")}
            res["plan_log"] = [line.split("result: ")[1] for line in log.splitlines() if "'plan' result" in line]
            res["slices"] = int(plan["slices"])
            res["arena_bytes"] = int(plan["arena_bytes"])
            res["invariant_steps"] = int(plan["invariant_steps"])
            res["persistent_bytes"] = int(plan["persistent_bytes"])
            res["flops_without_reuse"] = float(plan["flops_total_without_reuse"])
            res[key] = {"wall_seconds": wall, "amplitudes": count, "value": [value.real, value.imag],
                        "flops_executed": sliced_flops,
                        "tflops": sliced_flops / wall / 1e12,
                        "predicted_seconds": float(plan["predicted_seconds_total"]),
                        "first_slice_step_seconds": float(step_seconds.sum()),
                        # setup: uploading inputs and, out of core, pinning the host arena (once per step)
                        "setup_seconds": float(metrics["setup_seconds"]),
                        "loop_seconds_per_amplitude": float(metrics["loop_seconds"]) / count}
            if "reduced_steps" in amps:  # the steps a reduced compute mode ran in
                res[key]["reduced_steps"] = json.loads(amps["reduced_steps"])
            if "reference_relative_error" in amps:  # compute, compress_spilled: the first amplitude against complex128
                res[key]["relative_error_vs_complex128"] = float(amps["reference_relative_error"])
            if "spilled_ratio" in amps:  # compress_spilled
                res[key]["spilled_ratio"] = float(amps["spilled_ratio"])
                res[key]["spilled_stored_bytes"] = int(amps["spilled_stored_bytes"])
            if "in_core" in case and case["in_core"] in report["cases"]:
                in_core = report["cases"][case["in_core"]][key]
                res[key]["fraction_of_in_core"] = res[key]["tflops"] / in_core["tflops"]
                res[key]["fraction_of_in_core_without_setup"] = (in_core["loop_seconds_per_amplitude"] /
                                                                 res[key]["loop_seconds_per_amplitude"])
                res[key]["spilled"] = int(plan["spilled"])
                res[key]["host_copy_bytes_per_slice"] = int(plan["host_copy_bytes"])
            if cgemm[mode]:
                res[key]["fraction_of_cgemm"] = res[key]["tflops"] * 1e12 / cgemm[mode]
            print(f"{name} {mode}: {res[key]}", file=sys.stderr)
        if args.cotengra and "in_core" not in case:
            net, _, _ = load_network(work / name)
            res["cotengra"] = cotengra_path(net, args.cotengra)
            res["path"]["seconds"] = float(attrs(work / name / "outputs" / "path.h5")["qstage.wall_seconds"])
            print(f"{name} cotengra: {res['cotengra']} vs ours {res['path']}", file=sys.stderr)
        peers = (["torch"] if args.torch else []) + (["numpy"] if args.numpy and flops < 2e13 else [])
        if "in_core" in case:
            peers = []  # the same network as the in-core case
        if peers and res["slices"] > 1:
            res["peers"] = "skipped: the peers run unsliced, and this case needs slicing to fit"
        elif peers:
            net, tensors, ssa = load_network(work / name)
            for peer in peers:
                seconds, value = peer_contract(net, tensors, ssa, peer)
                res[peer] = {"seconds": seconds, "tflops": flops / seconds / 1e12, "value": [value.real, value.imag],
                             "qstage_speedup": seconds / res["qstage"]["wall_seconds"],
                             "relative_difference": abs(value - complex(*res["qstage"]["value"])) / abs(value)}
                print(f"{name} {peer}: {res[peer]}", file=sys.stderr)
        report["cases"][name] = res
    print(json.dumps(report, indent=1, default=float))


if __name__ == "__main__":
    main()
