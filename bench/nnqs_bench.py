#!/usr/bin/env python3
"""sci.nnqs on one device: where an iteration's time goes, and the network's inference against
the same network in PyTorch eager on the same device.

1. Runs `qstage run` on a sci.nnqs spec it writes for --fcidump (with --params added) and reads
   the output's iterations/: per iteration the seconds generating, de-duplicating, inferring and
   optimizing, and their shares (seed 004's bottleneck figure: inference and optimization should
   dominate, generation plus de-duplication stay under 20 %).
2. Builds the same network in PyTorch (scripts/nnqs_model.py's Wavefunction, the parameter names
   of qstage's), loads the run's trained weights (/network), moves it to the device and times, in
   eager mode:
   - inference: as many rows as the run's largest iteration inferred, in batches of the run's
     inference_batch, from host uint8 occupations to host float64 results, no gradient kept: what
     qstage's `seconds_inference` times (occupations of the run's final space, repeated; the
     cost does not depend on which determinants they are);
   - a training step on the final space: forward and backward over it in batches of train_batch,
     then AdamW (for scale; qstage's `seconds_optimize` also holds H within the space and its
     eigenvector, so it is printed per step, not compared).
   Both tools' inference as configurations per second, and their ratio.

    python3 bench/nnqs_bench.py --qstage build/qstage --fcidump h2o_FCIDUMP --device cuda \\
        --params "max_iterations: 4, steps: 100, fit_steps: 100, max_new_dets: 2000"

Prints one JSON object (and the split as a table on stderr). Needs torch and h5py; --python runs
the eager part in another Python (the GPU machine's, whose torch has CUDA).
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EAGER = r"""
import json, sys, time
import h5py, torch
sys.path.insert(0, {scripts!r})
from nnqs_model import Wavefunction, fcidump_header, load_weights
norb, nelec, ms2 = fcidump_header({fcidump!r})
na, nb = (nelec + ms2) // 2, (nelec - ms2) // 2
device = torch.device({device!r})
with h5py.File({output!r}, "r") as f:
    dets = f["dets"][()]
    model_attrs = dict(f.attrs)
torch.manual_seed(1)
model = Wavefunction(norb, na, nb, {embedding}, {layers}, {heads}, tuple({phase_hidden})).double()
load_weights(model, {output!r})
model = model.to(device)
# occupations as qstage's network reads them: spin orbital 2p = orbital p's alpha, 2p + 1 its beta
rows = dets.shape[0]
bits = torch.zeros((rows, 2 * norb), dtype=torch.uint8)
for p in range(norb):
    bits[:, 2 * p] = torch.tensor(((dets[:, 0] >> p) & 1).tolist(), dtype=torch.uint8)
    bits[:, 2 * p + 1] = torch.tensor(((dets[:, 1] >> p) & 1).tolist(), dtype=torch.uint8)
space = bits
want = {rows_inferred}
if want > rows:
    bits = bits.repeat((want + rows - 1) // rows, 1)[:want]
else:
    bits = bits[:want]
batch = {inference_batch}
def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()
def infer():
    out_a, out_f = [], []
    with torch.no_grad():
        for b in range(0, bits.shape[0], batch):
            x = bits[b:b + batch].to(device).double()
            a, f = model(x)
            out_a.append(a.cpu()), out_f.append(f.cpu())
    sync()
infer()  # (warm-up: kernels loaded, allocator filled)
times = []
for _ in range({repeats}):
    t = time.perf_counter(); infer(); times.append(time.perf_counter() - t)
train_batch = {train_batch}
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def train_step():
    opt.zero_grad()
    for b in range(0, space.shape[0], train_batch):
        x = space[b:b + train_batch].to(device).double()
        a, f = model(x)
        (a.sum() + f.sum()).backward()
    opt.step()
    sync()
train_step()
steps = []
for _ in range({repeats}):
    t = time.perf_counter(); train_step(); steps.append(time.perf_counter() - t)
print(json.dumps({{"rows": int(bits.shape[0]), "inference_seconds": min(times), "inference_seconds_all": times,
                  "space": int(space.shape[0]), "train_step_seconds": min(steps), "torch": torch.__version__,
                  "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fcidump", required=True)
    ap.add_argument("--qstage", default="qstage")
    ap.add_argument("--device", default="cuda", help="qstage's --device, and the eager network's (cuda: GPU 0)")
    ap.add_argument("--params", default="max_iterations: 4, steps: 100, fit_steps: 100, max_new_dets: 2000",
                    help="sci.nnqs parameters added to the spec (YAML flow mapping entries)")
    ap.add_argument("--inference-batch", type=int, default=65536)
    ap.add_argument("--train-batch", type=int, default=4096)
    ap.add_argument("--ranks", type=int, default=1, help="MPI ranks for qstage (mpirun -np)")
    ap.add_argument("--python", default=sys.executable, help="the Python (with torch and h5py) for the eager part")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats of each eager measurement (the least counts)")
    ap.add_argument("--heads", type=int, default=4, help="the run's attention heads (the other sizes are read from its weights)")
    ap.add_argument("--skip-eager", action="store_true")
    ap.add_argument("--workdir", help="keep the run here (default: a temporary folder)")
    a = ap.parse_args()
    fcidump = Path(a.fcidump).resolve()
    scripts = str(Path(__file__).resolve().parent.parent / "scripts")
    out = {"fcidump": str(fcidump), "device": a.device, "ranks": a.ranks, "params": a.params}

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.workdir) if a.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        spec = work / "nnqs.yaml"
        spec.write_text(f"name: nnqs\nsteps:\n  - id: nnqs\n    stage: sci.nnqs\n    params: {{fcidump: {fcidump}, "
                        f"inference_batch: {a.inference_batch}, train_batch: {a.train_batch}, {a.params}}}\n")
        run_dir = work / "run"
        cmd = [a.qstage, "run", str(spec), "--run-dir", str(run_dir), "--device", a.device]
        if a.ranks > 1:
            cmd = ["mpirun", "-np", str(a.ranks), "--bind-to", "none"] + cmd
        t = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        out["seconds"] = time.time() - t
        if p.returncode != 0:
            out["error"] = p.stderr[-3000:]
            print(json.dumps(out, indent=1))
            sys.exit(1)
        output = run_dir / "outputs" / "nnqs.h5"
        import h5py

        with h5py.File(output, "r") as f:
            it = {k: f["iterations"][k][()].tolist() for k in f["iterations"]}
            out["energy"] = float(f["energy"][()])
            out["dets"] = int(f["dets"].shape[0])
            where = f.attrs["network_device"]
            out["network_device"] = where.decode() if isinstance(where, bytes) else str(where)
            out["parameters"] = int(f.attrs["parameters"])
            out["steps_taken"] = int(f["steps/energy"].shape[0]) + int(sum(it["fit_steps"]))
            if "qstage.peak_device_bytes" in f.attrs:
                out["peak_device_bytes"] = int(f.attrs["qstage.peak_device_bytes"])
        out["iterations"] = it
        parts = ["generate", "dedup", "inference", "optimize"]
        totals = {k: sum(it["seconds_" + k]) for k in parts}
        whole = sum(totals.values())
        out["split"] = {k: totals[k] / whole for k in parts} if whole > 0 else {}
        out["generate_plus_dedup_share"] = (totals["generate"] + totals["dedup"]) / whole if whole > 0 else None
        inferred = sum(it["unique"])
        out["qstage_inference_rows_per_s"] = inferred / totals["inference"] if totals["inference"] > 0 else None
        out["qstage_optimize_seconds_per_step"] = totals["optimize"] / max(out["steps_taken"], 1)
        print(f"{'iter':>4} {'dets':>8} {'unique':>9} {'gen s':>8} {'dedup s':>8} {'infer s':>8} {'opt s':>8}",
              file=sys.stderr)
        for i in range(len(it["dets"])):
            print(f"{i:4d} {it['dets'][i]:8d} {it['unique'][i]:9d} {it['seconds_generate'][i]:8.3f} "
                  f"{it['seconds_dedup'][i]:8.3f} {it['seconds_inference'][i]:8.3f} {it['seconds_optimize'][i]:8.3f}",
                  file=sys.stderr)

        if not a.skip_eager and inferred > 0:
            with h5py.File(output, "r") as f:
                names = list(f["network"])
                layers = len({n.split(".")[2] for n in names if n.startswith("decoder.layers.")})
                embedding = f["network/tokens.weight"].shape[1]
                phase = sorted((n for n in names if n.startswith("phase.") and n.endswith(".weight")),
                               key=lambda n: int(n.split(".")[1]))
                phase_hidden = [f["network/" + n].shape[0] for n in phase[:-1]]
            device = "cuda" if a.device == "cuda" else "cpu"
            code = EAGER.format(scripts=scripts, fcidump=str(fcidump), device=device, output=str(output),
                                embedding=embedding, layers=layers, heads=a.heads, phase_hidden=phase_hidden,
                                rows_inferred=max(it["unique"]), inference_batch=a.inference_batch,
                                train_batch=a.train_batch, repeats=a.repeats)
            e = subprocess.run([a.python, "-c", code], capture_output=True, text=True)
            if e.returncode != 0:
                out["eager_error"] = e.stderr[-3000:]
            else:
                eager = json.loads(e.stdout.strip().splitlines()[-1])
                out["eager"] = eager
                eager_rate = eager["rows"] / eager["inference_seconds"]
                out["eager_inference_rows_per_s"] = eager_rate
                # qstage's per iteration at its largest (the same row count the eager run timed)
                largest = max(range(len(it["unique"])), key=lambda i: it["unique"][i])
                q_rate = it["unique"][largest] / it["seconds_inference"][largest] if it["seconds_inference"][largest] > 0 else None
                out["qstage_inference_rows_per_s_largest"] = q_rate
                out["inference_ratio_qstage_over_eager"] = q_rate / eager_rate if q_rate else None
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
