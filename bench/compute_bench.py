#!/usr/bin/env python3
"""Compute modes on compute-bound contractions: tn.contract in full (FP32), tf32, 3xtf32 and
bf16, each mode's rate beside FP32's and its error against complex128 (tn.contract's reference
check), with the cgemm ceiling of every mode (qstage_bench ceilings) and PyTorch on the same
contraction order in the same run.

  python3 bench/compute_bench.py --qstage Q --bench QB --device cuda --work /tmp/cb [--cases chain,tensor] [--torch]

Cases (generic networks from tn.build's einsum source, seeded random complex64 tensors):
  chain   ab,bc,cd,de->ae, every extent 8192: three 8192^3 complex products (1.3e13 flops)
  tensor  abcd,cdef,efgh->abgh, every extent 48: two 2304^3 products whose operands are permuted
          into place first (a tensor-network step's shape)
  trace   ab,bc,cd,da->, every extent 4096: two 4096^3 complex products and a scalar result (the
          products, not the result's handling, set the time)
  small   ab,bc,cd->ad, extents 256 (for the CPU: checks the script)
qstage: one run of tn.build, tn.path, tn.plan (complex64, in core), then two tn.contract steps per
mode (compute: MODE, time_steps: false): the first cold (a mode's first GEMMs of their kind in the
process: on an H100 tf32's and bf16's took 0.09-0.12 s where their products need a few ms) and
checked against complex128, the second warm; the time is the warm step's loop_seconds (the
contraction, without uploading the inputs; the cold one's beside it), flops tn.plan's flops_total (8 real flops per complex multiply-add), the error
tn.contract's reference_relative_error. PyTorch: torch.einsum pairwise in qstage's path order on
the GPU, complex64, warm, best of 5; fp32, and tf32 with torch.backends.cuda.matmul.allow_tf32
(cuBLAS's complex TF32). Prints one JSON object and a markdown table.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

CASES = {
    "chain": {"expression": "ab,bc,cd,de->ae", "size": 8192},
    "tensor": {"expression": "abcd,cdef,efgh->abgh", "size": 48},
    "trace": {"expression": "ab,bc,cd,da->", "size": 4096},
    "small": {"expression": "ab,bc,cd->ad", "size": 256},
}
MODES = ["full", "tf32", "3xtf32", "bf16"]


def spec(case):
    """One run: the network, its path and plan once, then tn.contract in every mode."""
    letters = sorted({c for c in case["expression"] if c.isalpha()})
    sizes = ", ".join(f"{c}: {case['size']}" for c in letters)
    text = f"""name: compute-bench
steps:
  - id: net
    stage: tn.build
    params: {{einsum: {{expression: "{case['expression']}", sizes: {{{sizes}}}, seed: 2}}}}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{max_tries: 16, seed: 1}}
  - id: plan
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{precision: complex64}}
"""
    for mode in MODES:  # (then again, warm: the mode's GEMM kernels have run once in the process)
        text += f"""  - id: value_{mode}
    stage: tn.contract
    inputs: {{network: net, plan: plan}}
    params: {{compute: {mode}, time_steps: false, reference_check: true}}
  - id: warm_{mode}
    stage: tn.contract
    inputs: {{network: net, plan: plan}}
    params: {{compute: {mode}, time_steps: false, reference_check: false}}
"""
    return text


def qstage_case(args, name, case):
    run_dir = Path(args.work) / name
    spec_path = Path(args.work) / f"{name}.yaml"
    spec_path.write_text(spec(case))
    r = subprocess.run([args.qstage, "run", str(spec_path), "--run-dir", str(run_dir), "--device", args.device],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"qstage failed ({r.returncode}):\n{r.stderr[-3000:]}")
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        flops = float(f.attrs["flops_total"])
    manifest = json.loads((run_dir / "manifest.json").read_text())["steps"]
    res = {}
    for mode in MODES:
        with h5py.File(run_dir / "outputs" / f"value_{mode}.h5") as f:
            a = dict(f.attrs)
        metrics = manifest[f"value_{mode}"]["metrics"]
        cold = float(metrics["loop_seconds"])
        loop = float(manifest[f"warm_{mode}"]["metrics"]["loop_seconds"])
        res[mode] = {"seconds": loop, "cold_seconds": cold, "tflops": flops / loop / 1e12, "flops": flops,
                     "relative_error_vs_complex128": float(a["reference_relative_error"]),
                     # where the loop went (the engine's split): which of reading, uploading and
                     # computing holds a one-item contraction far below the cgemm rate
                     "split": {k: float(metrics[k]) for k in ("read_seconds", "h2d_seconds", "compute_seconds",
                                                              "d2h_seconds", "write_seconds", "setup_seconds")}}
        if "reduced_steps" in a:
            res[mode]["reduced_steps"] = json.loads(a["reduced_steps"])
        res[mode]["over_full"] = res[mode]["tflops"] / res["full"]["tflops"]
        print(f"{name} {mode}: {res[mode]}", file=sys.stderr)
    return res, run_dir


def torch_case(run_dir, tf32):
    import torch
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        net = json.loads(bytes(f["network"][()]).decode())
        data = [f["tensors"][n][()] for n in sorted(f["tensors"])]
    with h5py.File(run_dir / "outputs" / "path.h5") as f:
        ssa = f["path"][()].tolist()
    sizes = {int(k): v for k, v in net["size_dict"].items()}
    torch.backends.cuda.matmul.allow_tf32 = tf32
    ops = [(list(m), torch.from_numpy(t.reshape([sizes[x] for x in m]).astype(np.complex64)).cuda())
           for t, m in zip(data, net["inputs"])]
    letters = {m: chr(ord("a") + i) for i, m in enumerate(sorted(sizes))}
    output = list(net["output"])

    def contract():
        items = list(ops)
        for a, b in ssa:
            (ma, ta), (mb, tb) = items[a], items[b]
            later = set(output) | {m for i, (ms, _) in enumerate(items) if i not in (a, b) and ms is not None for m in ms}
            mc = [m for m in ma + [x for x in mb if x not in ma] if m in later]
            eq = f"{''.join(letters[m] for m in ma)},{''.join(letters[m] for m in mb)}->{''.join(letters[m] for m in mc)}"
            items.append((mc, torch.einsum(eq, ta, tb)))
            items[a] = items[b] = (None, None)
        return items[-1][1]

    contract()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        contract()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    torch.backends.cuda.matmul.allow_tf32 = False
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qstage", required=True)
    ap.add_argument("--bench", required=True, help="qstage_bench, for the cgemm ceilings")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", default="/tmp/compute-bench")
    ap.add_argument("--cases", default="chain,tensor")
    ap.add_argument("--gemm", type=int, default=4096, help="m = n = k of the ceiling cgemm")
    ap.add_argument("--torch", action="store_true")
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    g = args.gemm
    r = subprocess.run([args.bench, "ceilings", "--device", args.device, "--m", str(g), "--n", str(g), "--k", str(g)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"qstage_bench failed:\n{r.stderr}")
    report = {"ceilings": json.loads(r.stdout)["gemm_complex64"], "cases": {}}
    print(json.dumps(report["ceilings"]), file=sys.stderr)
    for name in args.cases.split(","):
        res, run_dir = qstage_case(args, name, CASES[name])
        if args.torch:
            for tf32 in (False, True):
                sec = torch_case(run_dir, tf32)
                res["torch_tf32" if tf32 else "torch_fp32"] = {"seconds": sec, "tflops": res["full"]["flops"] / sec / 1e12}
        report["cases"][name] = res
    print(json.dumps(report, indent=1))
    print("\n| case | mode | TFLOP/s | x full | rel. error vs complex128 |\n|---|---|---|---|---|")
    for name, res in report["cases"].items():
        for mode, m in res.items():
            print(f"| {name} | {mode} | {m['tflops']:.1f} | {m.get('over_full', float('nan')):.2f} | "
                  f"{m.get('relative_error_vs_complex128', float('nan')):.1e} |")


if __name__ == "__main__":
    main()
