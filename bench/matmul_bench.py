#!/usr/bin/env python3
"""tensor.matmul benchmark: stream C = A . B through qstage with A at least four times the device
budget, and compare, in the same run,
  - its streaming time with its bound: the slower of the PCIe transfers and the cgemm work for the
    same batch shape (both measured by `qstage_bench ceilings` right after);
  - the sum of its busy phases with its wall time (overlap);
  - checkpointing after every batch round with never checkpointing (--checkpoint);
  - on the cpu backend, one in-memory threaded OpenBLAS cgemm of the same product (--inmemory).
Prints a JSON report and markdown table rows for docs/benchmarks.md.

  python3 bench/matmul_bench.py --qstage build/qstage --bench build/bench/qstage_bench \\
      --device cuda --m 131072 --k 16384 --n 16384 --budget 4GiB --workdir /dev/shm/qbench
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def size(text):
    for u, f in UNITS.items():
        if text.endswith(u):
            return int(float(text[: -len(u)]) * f)
    return int(text)


def sh(cmd, **kw):
    print("+", " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"command failed ({r.returncode}): {cmd}")
    return r


def step_metrics(run_dir, step):
    m = json.loads((Path(run_dir) / "manifest.json").read_text())
    return m["steps"][step]["metrics"]


def run_matmul(a, spec_text, run_dir, checkpoint):
    spec = Path(a.workdir) / f"{run_dir.name}.yaml"
    spec.write_text(spec_text)
    sh([a.qstage, "run", spec, "--run-dir", run_dir, "--device", a.device, "--device-memory", a.budget,
        "--host-memory", a.host_budget, "--checkpoint-interval", checkpoint, "--progress-interval", "10s"])
    return step_metrics(run_dir, "c")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qstage", required=True)
    p.add_argument("--bench", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--workdir", required=True)
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--budget", required=True, help="device memory budget, e.g. 4GiB")
    p.add_argument("--host-budget", default="16GiB")
    p.add_argument("--checkpoint", action="store_true", help="also run with a checkpoint after every round")
    p.add_argument("--inmemory", action="store_true", help="also time one in-memory OpenBLAS cgemm (cpu)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args()

    work = Path(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    a_bytes = a.m * a.k * 8
    assert a_bytes >= 4 * size(a.budget), "A must be at least four times the device budget"

    inputs = f"""name: matmul-bench
steps:
  - id: a
    stage: tensor.random
    params: {{shape: [{a.m}, {a.k}], dtype: complex64, seed: 1}}
  - id: b
    stage: tensor.random
    params: {{shape: [{a.k}, {a.n}], dtype: complex64, seed: 2}}
"""
    (work / "inputs.yaml").write_text(inputs)
    sh([a.qstage, "run", work / "inputs.yaml", "--run-dir", work / "inputs", "--device", a.device,
        "--device-memory", a.budget, "--host-memory", a.host_budget, "--checkpoint-interval", "never"])
    out = work / "inputs" / "outputs"
    # Flush the generated inputs to disk first: their writeback would otherwise throttle the
    # timed step's own writes (the kernel's dirty-page limit), which measures the input step.
    os.sync()
    step = f"""name: matmul-bench-c
steps:
  - id: c
    stage: tensor.matmul
    inputs:
      a: {{file: {out / 'a.h5'}, dataset: /data}}
      b: {{file: {out / 'b.h5'}, dataset: /data}}
"""
    never = run_matmul(a, step, work / "never", "never")
    ceil = json.loads(sh([a.bench, "ceilings", "--device", a.device, "--m", never["batch_rows"], "--n", a.n,
                          "--k", a.k, "--io-dir", work / "io", "--io-bytes", "4GiB"]).stdout)

    flops = 8.0 * a.m * a.n * a.k
    h2d_bytes, d2h_bytes = a.m * a.k * 8, a.m * a.n * 8
    duplex = ceil["copies"]["duplex_each_way_GBps"] * 1e9
    t_pcie = max(h2d_bytes, d2h_bytes) / duplex
    t_gemm = flops / (ceil["gemm_complex64"]["fp32_TFLOPs"] * 1e12)
    bound = max(t_pcie, t_gemm)
    streaming = never["seconds"] - never["finalize_seconds"]
    loop = never["loop_seconds"]
    phases = {k: never[f"{k}_seconds"] for k in ["read", "h2d", "compute", "d2h", "write"]}
    report = {
        "date": datetime.date.today().isoformat(), "device": ceil["device"], "backend": ceil["backend"],
        "shape": {"m": a.m, "k": a.k, "n": a.n, "batch_rows": never["batch_rows"]},
        "a_bytes": a_bytes, "device_budget": a.budget, "a_over_budget": a_bytes / size(a.budget),
        "ceilings": ceil, "t_pcie_s": t_pcie, "t_gemm_s": t_gemm, "bound_s": bound,
        "bound_by": "cgemm" if t_gemm >= t_pcie else "PCIe",
        "step_seconds": never["seconds"], "streaming_seconds": streaming, "finalize_seconds": never["finalize_seconds"],
        "setup_seconds": never["setup_seconds"], "loop_seconds": loop,
        "fraction_of_bound": bound / streaming, "achieved_TFLOPs": flops / streaming / 1e12,
        "loop_fraction_of_bound": bound / loop, "loop_TFLOPs": flops / loop / 1e12,
        "phases_busy_s": phases, "phase_sum_s": sum(phases.values()), "longest_phase_s": max(phases.values()),
        "peak_device_bytes": never["peak_device_bytes"], "peak_host_bytes": never["peak_host_bytes"],
    }
    if a.checkpoint:
        (work / "never" / "outputs" / "c.h5").unlink()  # room on the disk for the second run
        every = run_matmul(a, step.replace("matmul-bench-c", "matmul-bench-ckpt"), work / "every", "0")
        report["checkpoint_every_round_s"] = every["seconds"]
        report["checkpoint_never_s"] = never["seconds"]
        report["checkpoint_overhead_ratio"] = every["seconds"] / never["seconds"]
        report["checkpoint_every_round_commit_s"] = every["commit_seconds"]
        report["checkpoint_every_round_finalize_s"] = every["finalize_seconds"]
    if a.inmemory:
        mem = json.loads(sh([a.bench, "inmemory-matmul", "--a", f"{out / 'a.h5'}:/data",
                             "--b", f"{out / 'b.h5'}:/data"]).stdout)
        report["inmemory_openblas"] = mem
        report["qstage_over_inmemory_gemm"] = never["seconds"] / mem["gemm_seconds"]
        report["qstage_over_inmemory_read_and_gemm"] = never["seconds"] / (mem["gemm_seconds"] + mem["read_seconds"])
    print(json.dumps(report, indent=2))
    print(f"\n| {report['date']} | {report['device']} | {a.m}x{a.k} . {a.k}x{a.n} | {a.budget} "
          f"(A = {report['a_over_budget']:.1f}x) | {streaming:.2f} s (setup {never['setup_seconds']:.2f}, loop {loop:.2f}) "
          f"| bound {bound:.2f} s ({report['bound_by']}) | {100 * report['fraction_of_bound']:.0f}% "
          f"(loop {100 * report['loop_fraction_of_bound']:.0f}%) | phases {report['phase_sum_s']:.2f} s summed, longest "
          f"{report['longest_phase_s']:.2f} s |")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
