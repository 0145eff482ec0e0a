#!/usr/bin/env python3
"""Distributed contraction against ideal slicing (issue 20; seed 000 section V): one network,
one path, two plans with the same per-rank budget - one for a single rank (sliced until it fits)
and one for P ranks (tn.plan's ranks: P: the large intermediates sharded) - contracted in the
same call:

  one       the one-rank plan on 1 rank                              T_1
  sliced    the one-rank plan's slices shared over P ranks (mpirun)  T_slicing
  dist      the P-rank plan distributed over P ranks (mpirun)        T_P

and reports S_P = T_1 / T_P, E_P = S_P / P (seed 000 eq. 10: the gain over ideal slicing, whose
time is T_1 / P), the gain over the measured slicing run, R_P (eq. 11: the one-rank plan's flops
over the P-rank plan's) and the share of R_P captured (E_P / R_P); TFLOP/s per rank against the
complex64 GEMM rate tn.plan measured on the same device; the redistributions' bytes a second
against `qstage_bench alltoall` (the same all-to-all alone, NCCL on cuda) for the same bytes;
and the plan's predicted compute and communication seconds beside the measured ones.

  python3 bench/tn_distributed_bench.py --lattice 6,7,5 --budget 2GiB --ranks 2 --device cuda --dir /tmp/tdb

With --out-of-core, a fourth run in the same call:

  dist_ooc  a P-rank plan made with out_of_core (intermediates spilled before slicing, so fewer
            slices; slots at most an eighth of the budget) over P ranks, each with
            --device-memory --ooc-device-memory: the shards that do not fit are held in host
            memory and stream through the device a slot at a time (`step_shard_on_host`)

reported beside the others (its speed-up over `one` and over `dist`).

Prints one JSON object (and the commands it ran) on stdout.
"""
import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import h5py


def spec(args, with_one):
    rows, cols, steps = args.lattice.split(",")
    source = f"lattice: {{rows: {rows}, cols: {cols}, steps: {steps}, seed: 1, disorder: 0.3}}, " \
             f"random_bitstrings: {{count: 1, seed: 1}}"
    plan = f"precision: {args.precision}, budget: {args.budget}"
    large = f", large_bytes: {args.large_bytes}" if args.large_bytes else ""
    text = f"""name: tndist
steps:
  - id: net
    stage: tn.build
    params: {{{source}}}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{max_seconds: 3600, max_tries: {args.tries}, seed: 0}}
  - id: plan1
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{{plan}}}
  - id: planP
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{{plan}, ranks: {args.ranks}{large}}}
  - id: sliced
    stage: tn.contract
    inputs: {{network: net, plan: plan1}}
  - id: dist
    stage: tn.contract
    inputs: {{network: net, plan: planP}}
"""
    if with_one:
        text += """  - id: one
    stage: tn.contract
    inputs: {network: net, plan: plan1}
"""
    return text


def ooc_spec(args):
    """p.yaml's steps (done by then) and the out-of-core P-rank plan and its run."""
    return spec(args, False) + f"""  - id: planPo
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{precision: {args.precision}, budget: {args.budget}, ranks: {args.ranks}, out_of_core: true}}
  - id: dist_ooc
    stage: tn.contract
    inputs: {{network: net, plan: planPo}}
"""


def sh(cmd, log):
    log.append(" ".join(shlex.quote(str(c)) for c in cmd))
    t = time.time()
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise SystemExit(f"failed ({r.returncode}): {log[-1]}")
    return r, time.time() - t


def attrs(run_dir, step):
    with h5py.File(Path(run_dir) / "outputs" / f"{step}.h5") as f:
        out = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
        for name in ("amplitudes", "value", "step_compute_seconds", "step_comm_seconds", "step_sent_bytes",
                     "sent_bytes_per_rank", "step_seconds", "step_shard_on_host"):
            if name in f:
                out[name] = f[name][()]
    return out


def plan_json(run_dir, step, dataset="plan"):
    """tn.plan's schedule ("plan") or its rates and predicted seconds ("prediction")."""
    with h5py.File(Path(run_dir) / "outputs" / f"{step}.h5") as f:
        return json.loads(bytes(f[dataset][()]).decode())


def ooc_report(args, run_dir, t1, tp, one_values, key):
    import numpy as np
    po = plan_json(run_dir, "planPo")["distribution"]
    r = attrs(run_dir, "dist_ooc")
    t = r["qstage.wall_seconds"]
    wide = po["plan"]
    flops = wide["invariant_flops"] + wide["slice_flops"] * wide["slices"]
    got = np.asarray(r[key]).ravel()
    return {"device_memory_per_rank": args.ooc_device_memory or args.budget, "slot_bytes": po.get("slot_bytes"),
            "slices": wide["slices"], "flops": flops, "moved_bytes": po["moved_bytes"],
            "redistributions": sum(s["transition"] == "redistribute" for s in po["steps"]),
            "seconds": t, "speedup_over_one": t1 / t, "speedup_over_dist": tp / t,
            "steps_with_shards_on_host": int(np.sum(r.get("step_shard_on_host", [0]))),
            "measured_first_slice": {"compute_seconds": float(np.sum(r.get("step_compute_seconds", [0]))),
                                     "comm_seconds": float(np.sum(r.get("step_comm_seconds", [0])))},
            "predicted_seconds_total": plan_json(run_dir, "planPo", "prediction")["distribution"]["predicted_seconds_total"],
            "peak_device_bytes": r["qstage.peak_device_bytes"], "peak_host_bytes": r.get("qstage.peak_host_bytes"),
            "relative_difference_vs_one": float(np.linalg.norm(one_values - got) / np.linalg.norm(one_values))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lattice", default="6,7,5", help="rows,cols,Trotter steps of tn.build's rectangular lattice")
    ap.add_argument("--budget", default="2GiB", help="tn.plan's budget of one contraction on one rank")
    ap.add_argument("--precision", default="complex64")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--large-bytes", default="", help="tn.plan's large_bytes for the P-rank plan (default: a quarter of the budget)")
    ap.add_argument("--tries", type=int, default=256)
    ap.add_argument("--out-of-core", action="store_true", help="also run the P-rank plan made with out_of_core (dist_ooc)")
    ap.add_argument("--ooc-device-memory", default="", help="--device-memory of each rank in dist_ooc (default: --budget)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dir", default="/tmp/tn_distributed_bench")
    ap.add_argument("--qstage", default="qstage")
    ap.add_argument("--qstage-bench", default="qstage_bench")
    ap.add_argument("--mpirun", default="mpirun")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    run_dir = d / "run"
    log = []
    # (--bind-to none: OpenMPI binds each rank to one core when -np is 1 or 2)
    mpi = [args.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(args.ranks)]
    (d / "p.yaml").write_text(spec(args, False))
    (d / "one.yaml").write_text(spec(args, True))
    # The P-rank runs first (net, path, plans and both P-rank contractions), then the one-rank
    # contraction in the same run directory (the other steps are done and kept).
    sh(mpi + [args.qstage, "run", d / "p.yaml", "--run-dir", run_dir, "--device", args.device], log)
    sh([args.qstage, "run", d / "one.yaml", "--run-dir", run_dir, "--device", args.device], log)
    if args.out_of_core:
        (d / "ooc.yaml").write_text(ooc_spec(args))
        sh(mpi + [args.qstage, "run", d / "ooc.yaml", "--run-dir", run_dir, "--device", args.device,
                  "--device-memory", args.ooc_device_memory or args.budget], log)
    p1, pp = plan_json(run_dir, "plan1"), plan_json(run_dir, "planP")
    e1, projected = plan_json(run_dir, "plan1", "prediction"), plan_json(run_dir, "planP", "prediction")["distribution"]
    dist = pp["distribution"]
    one, sliced, distr = attrs(run_dir, "one"), attrs(run_dir, "sliced"), attrs(run_dir, "dist")
    t1, ts, tp = one["qstage.wall_seconds"], sliced["qstage.wall_seconds"], distr["qstage.wall_seconds"]
    P = args.ranks
    flops_one = p1["invariant_flops"] + p1["slice_flops"] * p1["slices"]
    wide = dist["plan"]
    flops_dist = wide["invariant_flops"] + wide["slice_flops"] * wide["slices"]  # (invariant steps once, as the executor runs them)
    key = "amplitudes" if "amplitudes" in one else "value"
    import numpy as np
    a, b = np.asarray(one[key]).ravel(), np.asarray(distr[key]).ravel()
    rel = float(np.linalg.norm(a - b) / np.linalg.norm(a))
    comm_s = float(np.sum(distr.get("step_comm_seconds", [0])))
    sent = float(np.sum(distr.get("step_sent_bytes", [0])))
    largest = int(max(distr.get("step_sent_bytes", [0]))) if sent else 0
    nccl = None
    if largest:
        r, _ = sh(mpi + [args.qstage_bench, "alltoall", "--bytes", f"{largest * P // (P - 1)}B", "--device", args.device], log)
        nccl = json.loads(r.stdout[r.stdout.index("{"):])
    rates = e1.get("gemm_rate")
    out = {
        "network": f"lattice {args.lattice}", "precision": args.precision, "budget_per_rank": args.budget, "ranks": P,
        "large_bytes": args.large_bytes or "chosen by tn.plan's cost model",
        "one_rank_plan": {"slices": p1["slices"], "flops": flops_one},
        "P_rank_plan": {"slices": wide["slices"], "flops": flops_dist, "chains": len(dist["chains"]),
                        "redistributions": sum(s["transition"] == "redistribute" for s in dist["steps"]),
                        "moved_bytes": dist["moved_bytes"]},
        "seconds": {"one": t1, "sliced_over_P": ts, "distributed": tp},
        "S_P": t1 / tp, "E_P": t1 / tp / P, "gain_over_measured_slicing": ts / tp,
        "R_P": flops_one / flops_dist, "share_of_R_P": (t1 / tp / P) / (flops_one / flops_dist),
        "predicted": {"E_P": projected["E_P"], "R_P": dist["R_P"], "S_P": projected["S_P"],
                      "one_seconds": e1["predicted_seconds_total"],
                      "distributed_seconds": projected["predicted_seconds_total"],
                      "compute_seconds_per_slice": projected["predicted_compute_seconds"],
                      "comm_seconds_per_slice": projected["predicted_comm_seconds"]},
        "measured_first_slice": {"compute_seconds": float(np.sum(distr.get("step_compute_seconds", [0]))),
                                 "comm_seconds": comm_s, "sent_bytes_rank0": sent},
        "TFLOPs_per_rank": {"distributed": flops_dist / P / tp / 1e12, "one": flops_one / t1 / 1e12,
                            "gemm_rate_measured_by_tn_plan": rates / 1e12 if rates else None},
        "redistribution_GBps_rank0": sent / comm_s / 1e9 if comm_s else None,
        "alltoall_alone": nccl,
        "relative_difference_dist_vs_one": rel,
        "out_of_core": ooc_report(args, run_dir, t1, tp, a, key) if args.out_of_core else None,
        "peak_device_bytes": {"one": one["qstage.peak_device_bytes"], "sliced": sliced["qstage.peak_device_bytes"],
                              "distributed": distr["qstage.peak_device_bytes"]},
        "peak_host_bytes_distributed": distr.get("qstage.peak_host_bytes"),
        "commands": log,
    }
    print(json.dumps(out, indent=2, default=float))


if __name__ == "__main__":
    main()
