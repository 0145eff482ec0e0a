#!/usr/bin/env python3
"""The compression stages end to end: compress, decompress and compress.evaluate over an HDF5
dataset larger than the device budget, side by side with a plain streaming pass over the same
input (tensor.stats: read, copy to the device, reduce) and one that writes a dataset of its size
(tensor.random): a stage cannot stream faster than the engine reads its input or writes its output.
It also times outputs written compressed by the step that makes them (a step's compress_output,
bounds relative to each chunk's range): tensor.random (uniform values, the codec's worst case)
and, with --qaoa-qubits N, a QAOA state vector from tn.statevector (2^N complex64 amplitudes
in rows of 2^(N-6)), each beside the same step writing plain values; and compress.evaluate on
that state with bounds relative to its whole range and the QAOA energy's change (maxcut).

  python3 bench/compress_bench.py --qstage build/qstage --work /tmp/cpb --device cuda \\
      [--gib 2] [--pipelines integrated,quantized] [--bounds 1e-2,1e-3] [--device-memory 1GiB] [--qaoa-qubits 28]

The input is synthetic and seeded (the same on every machine): complex64 values whose real and
imaginary parts are normal numbers under an envelope of narrow bumps with rare spikes, so most
values lie near zero, as in circuit tensors (`spiky` in tests/python/oracle.py, one row of
4096 values per row, chunks of 256 rows = 8 MiB). It is written once and read from the page
cache in every step. GB/s are input bytes per second of the whole step (setup included), from
the run's manifest. Prints one JSON object.
"""
import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

COLS, CHUNK_ROWS = 4096, 256


def make_input(path, gib):
    rows = int(gib * 2**30 // (COLS * 8)) // CHUNK_ROWS * CHUNK_ROWS
    if path.exists():
        with h5py.File(path) as f:
            if f["x"].shape == (rows, COLS):
                return rows
    rng = np.random.default_rng(2026)
    i = np.arange(COLS)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", (rows, COLS), np.complex64, chunks=(CHUNK_ROWS, COLS))
        for r in range(0, rows, CHUNK_ROWS):
            env = np.exp(-((((i + r * 37) % 700) - 350) / 30.0) ** 2) + 1e-5
            env = np.broadcast_to(env, (CHUNK_ROWS, COLS)).copy()
            env[rng.random((CHUNK_ROWS, COLS)) < 0.003] = 50.0
            block = rng.standard_normal((CHUNK_ROWS, COLS)) + 1j * rng.standard_normal((CHUNK_ROWS, COLS))
            d[r:r + CHUNK_ROWS] = (block * env).astype(np.complex64)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qstage", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--pipelines", default="integrated,quantized")
    ap.add_argument("--bounds", default="1e-2,1e-3")
    ap.add_argument("--device-memory", default="1GiB")
    ap.add_argument("--qaoa-qubits", type=int, default=0)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    src = args.work / "in.h5"
    rows = make_input(src, args.gib)

    # Ceilings: a pass that only reads the input (tensor.stats), and one that only writes a
    # dataset of its size (tensor.random, whose generator runs at hundreds of GB/s on a GPU).
    steps = [f"  - id: read\n    stage: tensor.stats\n    inputs: {{x: {{file: {src}, dataset: x}}}}\n",
             f"  - id: write\n    stage: tensor.random\n    params: {{shape: [{rows}, {COLS}], dtype: complex64, "
             f"chunk_rows: {CHUNK_ROWS}}}\n"]
    qaoa = None
    if args.qaoa_qubits:
        n = args.qaoa_qubits
        bits = [format(b, "06b") + "0" * (n - 6) for b in range(64)]
        qaoa = (f"precision: complex64, qaoa: {{nodes: {n}, p: 2, seed: 1}}, bitstrings: {json.dumps(bits)}, "
                f"open: {list(range(6, n))}")
        steps.append(f"  - id: qaoa\n    stage: tn.statevector\n    params: {{{qaoa}}}\n")
    ids = []
    for p in args.pipelines.split(","):
        for b in args.bounds.split(","):
            tag = f"{p}_{b}".replace("-", "m").replace(".", "p")
            ids.append((p, b, tag))
            params = f"{{pipeline: {p}, error: {b}, threshold: {b}}}"
            steps.append(f"  - id: c_{tag}\n    stage: compress\n    inputs: {{x: {{file: {src}, dataset: x}}}}\n"
                         f"    params: {params}\n"
                         f"  - id: d_{tag}\n    stage: decompress\n    inputs: {{x: c_{tag}}}\n"
                         f"  - id: e_{tag}\n    stage: compress.evaluate\n    inputs: {{x: {{file: {src}, dataset: x}}}}\n"
                         f"    params: {params}\n")
            packed = f"{{pipeline: {p}, error: {b}, threshold: {b}, bounds: chunk}}"
            steps.append(f"  - id: w_{tag}\n    stage: tensor.random\n    params: {{shape: [{rows}, {COLS}], "
                         f"dtype: complex64, chunk_rows: {CHUNK_ROWS}}}\n    compress_output: {packed}\n")
            if qaoa:
                steps.append(f"  - id: q_{tag}\n    stage: tn.statevector\n    params: {{{qaoa}}}\n"
                             f"    compress_output: {packed}\n"
                             f"  - id: eq_{tag}\n    stage: compress.evaluate\n    inputs: {{x: qaoa}}\n"
                             f"    params: {{pipeline: {p}, error: {b}, threshold: {b}, "
                             f"maxcut: {{nodes: {args.qaoa_qubits}, seed: 1}}}}\n")
    spec = args.work / "spec.yaml"
    spec.write_text("name: compress-bench\nsteps:\n" + "".join(steps))
    run_dir = args.work / f"run-{args.device}"
    r = subprocess.run([args.qstage, "run", str(spec), "--run-dir", str(run_dir), "--device", args.device,
                        "--device-memory", args.device_memory], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"qstage failed ({r.returncode}):\n{r.stderr[-3000:]}")
    m = json.loads((run_dir / "manifest.json").read_text())["steps"]
    input_gbps = lambda step: rows * COLS * 8 / m[step]["metrics"]["seconds"] / 1e9
    read, write = input_gbps("read"), input_gbps("write")
    ranges = [float(x) for x in re.findall(r"measured in ([0-9.]+)s", r.stderr)]
    out = {"device": m["read"]["device"], "input_bytes": rows * COLS * 8, "device_memory": args.device_memory,
           "read_pass_gbps": read, "write_pass_gbps": write, "range_pass_seconds": ranges, "cases": []}
    if qaoa:
        out["qaoa_plain_seconds"] = m["qaoa"]["metrics"]["seconds"]

    def stored_ratio(step, dataset):
        with h5py.File(run_dir / "outputs" / f"{step}.h5") as f:
            d = f[dataset]
            return d.size * d.dtype.itemsize / float(d.attrs["codec.stored_bytes"])
    for p, b, tag in ids:
        with h5py.File(run_dir / "outputs" / f"e_{tag}.h5") as e:
            ev = {k: float(e[k][()]) for k in ["ratio", "max_error", "bound", "fidelity", "compress_gbps",
                                                "decompress_gbps"]}
        out["cases"].append({
            "pipeline": p, "bound": float(b), "ratio": ev["ratio"], "fidelity": ev["fidelity"],
            "compress_step_gbps": input_gbps(f"c_{tag}"), "decompress_step_gbps": input_gbps(f"d_{tag}"),
            "compress_vs_read": input_gbps(f"c_{tag}") / read, "decompress_vs_write": input_gbps(f"d_{tag}") / write,
            "evaluate_codec_gbps": [ev["compress_gbps"], ev["decompress_gbps"]],
            "compress_busy": {k: m[f"c_{tag}"]["metrics"][k] for k in ["read_seconds", "compute_seconds", "setup_seconds",
                                                                     "loop_seconds", "commit_seconds",
                                                                     "finalize_seconds", "seconds"]},
            "decompress_busy": {k: m[f"d_{tag}"]["metrics"][k] for k in ["read_seconds", "h2d_seconds", "compute_seconds",
                                                                       "write_seconds", "seconds"]},
            "peak_device_bytes": m[f"c_{tag}"]["metrics"]["peak_device_bytes"],
            "random_written_compressed": {"gbps": input_gbps(f"w_{tag}"), "vs_plain_write": input_gbps(f"w_{tag}") / write,
                                          "ratio": stored_ratio(f"w_{tag}", "data")}})
        if qaoa:
            out["cases"][-1]["qaoa_written_compressed"] = {
                "seconds": m[f"q_{tag}"]["metrics"]["seconds"],
                "vs_plain": m["qaoa"]["metrics"]["seconds"] / m[f"q_{tag}"]["metrics"]["seconds"],
                "ratio": stored_ratio(f"q_{tag}", "amplitudes")}
            with h5py.File(run_dir / "outputs" / f"eq_{tag}.h5") as e:
                out["cases"][-1]["qaoa_state_whole_range"] = {
                    k: float(e[k][()]) for k in ["ratio", "fidelity", "energy_original", "energy_decoded",
                                                 "energy_relative_error", "compress_gbps", "decompress_gbps"]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
