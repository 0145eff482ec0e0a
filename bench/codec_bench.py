"""The codec on quantum-circuit tensors (issue 4's benchmark), side by side with peers.

    python3 bench/codec_bench.py --qstage BIN --bench QSTAGE_BENCH --plugin DIR --work /tmp/cb \
        [--cases qaoa22,qaoa20p4] [--device cuda] [--bounds 1e-2,5e-3,1e-3] [--pipelines szx,...] [--peers]

For each case, qstage builds a QAOA MaxCut light-cone network for <Z_a Z_b> (tn.build, tn.path);
this script contracts it along qstage's path (numpy, or torch on a GPU when present) and keeps
its largest intermediate, the kind of tensor seed 003 compresses. On that tensor (complex64):
  - qstage's codec, every pipeline and bound: `qstage_bench codec` (ratio, GB/s end to end and
    device only, largest error, fidelity);
  - the change in <Z_a Z_b> when the contraction goes on with the decoded tensor instead (seed
    003 Fig. 11), decoded through h5py and qstage's HDF5 filter plugin (the CPU decoder);
  - with --peers: zstd (lossless, level 3), and SZ3 and ZFP through hdf5plugin at the same
    absolute error bound (bound times the tensor's value range), ratio and CPU MB/s.
Prints one JSON object on stdout; progress on stderr.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CASES = {  # tn.build qaoa parameters and the Pauli term; largest intermediates 2^23 to 2^24 values
    "qaoa16": {"qaoa": "{nodes: 16, p: 2, seed: 1}", "pauli": "Z0 Z1"},  # small: a smoke test
    "qaoa22": {"qaoa": "{nodes: 22, p: 3, seed: 2}", "pauli": "Z0 Z1"},
    "qaoa20p4": {"qaoa": "{nodes: 20, p: 4, seed: 1}", "pauli": "Z0 Z1"},
    "qaoa24": {"qaoa": "{nodes: 24, p: 3, seed: 2}", "pauli": "Z0 Z1"},
    # A random-circuit amplitude (tn_bench's medium network: 6 x 9 grid, 10 cycles); its largest
    # intermediate along qstage's path has 2^27 values. The "change" is the amplitude's.
    "rc54": {"random": "{rows: 6, cols: 9, cycles: 10, seed: 1}", "bitstrings": "{count: 1, seed: 1}"},
}
FILTER_ID = 32881
PIPELINES = ["szx", "threshold", "group", "group2l", "integrated", "quantized"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def build(args, name, case):
    run_dir = Path(args.work) / name
    spec = run_dir.with_suffix(".yaml")
    source = (f"{{qaoa: {case['qaoa']}, pauli: '{case['pauli']}'}}" if "qaoa" in case
              else f"{{random: {case['random']}, random_bitstrings: {case['bitstrings']}}}")
    spec.write_text(f"""name: {name}
steps:
  - id: net
    stage: tn.build
    params: {source}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{max_tries: 300, max_seconds: 20, seed: 1}}
  - id: plan
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{precision: complex128}}
  - id: value
    stage: tn.contract
    inputs: {{network: net, plan: plan}}
""")
    subprocess.run([args.qstage, "run", str(spec), "--run-dir", str(run_dir), "--device", args.device],
                   check=True, capture_output=True, text=True)
    return run_dir


def load(run_dir):
    import h5py
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        net = json.loads(bytes(f["network"][()]).decode())
        tensors = [f["tensors"][f"t{i:06d}"][()] for i in range(len(net["inputs"]))]
        bits = f["bitstrings"][0] if "bitstrings" in f else None
    for t, q in net.get("projections", []):  # <x_q| of the (first) bitstring, as tn.contract does
        tensors[t] = np.eye(2, dtype=tensors[t].dtype)[int(bits[q])]
    sizes = {int(k): v for k, v in net["size_dict"].items()}
    tensors = [t.reshape([sizes[m] for m in modes]) for t, modes in zip(tensors, net["inputs"])]
    with h5py.File(run_dir / "outputs" / "path.h5") as f:
        ssa = f["path"][()].tolist()
    with h5py.File(run_dir / "outputs" / "value.h5") as f:
        value = complex(np.asarray(f["value" if "value" in f else "amplitudes"][()]).reshape(-1)[0])
    return net, tensors, ssa, value


class Contraction:
    """Pairwise contraction along an SSA path; `replace(step, array)` swaps in a step's result."""

    def __init__(self, net, tensors, ssa):
        self.net, self.ssa = net, ssa
        self.modes = [list(m) for m in net["inputs"]]
        self.tensors = tensors
        try:
            import torch
            self.torch = torch if torch.cuda.is_available() else None
        except ImportError:
            self.torch = None

    def run(self, keep_largest=False, replace=None):
        arrays = [self.asarray(t) for t in self.tensors]
        modes = [list(m) for m in self.modes]
        live = set(range(len(arrays)))
        largest = (0, None, None)
        for step, (a, b) in enumerate(self.ssa):
            live -= {a, b}
            others = set(self.net["output"])
            for i in live:
                others.update(modes[i])
            out = [m for m in dict.fromkeys(modes[a] + modes[b]) if m in others]
            local = {m: i for i, m in enumerate(dict.fromkeys(modes[a] + modes[b]))}
            c = self.einsum(arrays[a], [local[m] for m in modes[a]], arrays[b], [local[m] for m in modes[b]],
                            [local[m] for m in out])
            if replace is not None and replace[0] == step:
                c = self.asarray(replace[1].reshape(c.shape).astype(np.complex128))
            if keep_largest:
                count = c.numel() if self.torch else c.size
                if count > largest[0]:
                    largest = (count, step, c)
            arrays.append(c)
            modes.append(out)
            live.add(len(arrays) - 1)
            arrays[a] = arrays[b] = None
        root = arrays[-1]
        value = complex(root.reshape(-1)[0].item()) if self.torch else complex(root.reshape(-1)[0])
        if keep_largest:
            t = largest[2]
            return value, largest[1], (t.cpu().numpy() if self.torch else t)
        return value

    def asarray(self, t):
        return self.torch.as_tensor(np.asarray(t, dtype=np.complex128), device="cuda") if self.torch else np.asarray(t, dtype=np.complex128)

    def einsum(self, x, xm, y, ym, out):
        return (self.torch.einsum(x, xm, y, ym, out) if self.torch else np.einsum(x, xm, y, ym, out, optimize=True))


def cd_values(pipeline, bound_abs):
    t = 0.0 if pipeline == "szx" else bound_abs
    lo_hi = lambda v: struct.unpack("<II", struct.pack("<d", v))
    return (1, 1, PIPELINES.index(pipeline), 256, 0) + lo_hi(t) + lo_hi(bound_abs)


def through_plugin(path, x, pipeline, bound_abs):
    """x (complex64) written with qstage's filter (one chunk) and read back: decoded values and bytes."""
    import h5py
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", data=x, chunks=x.shape, compression=FILTER_ID,
                             compression_opts=cd_values(pipeline, bound_abs))
        stored = d.id.get_storage_size()
    with h5py.File(path, "r") as f:
        return f["x"][()], stored


def peers(path, x, bound_abs):
    import h5py
    import hdf5plugin
    import zstandard
    comps = x.view(np.float32).reshape(-1)
    res = {}
    start = time.perf_counter()
    packed = zstandard.ZstdCompressor(level=3).compress(comps.tobytes())
    c = time.perf_counter() - start
    start = time.perf_counter()
    zstandard.ZstdDecompressor().decompress(packed)
    d = time.perf_counter() - start
    res["zstd"] = {"ratio": comps.nbytes / len(packed), "compress_MBps": comps.nbytes / c / 1e6,
                   "decompress_MBps": comps.nbytes / d / 1e6, "max_error": 0.0}
    for name, opts in (("sz3", hdf5plugin.SZ3(absolute=bound_abs)), ("zfp", hdf5plugin.Zfp(accuracy=bound_abs))):
        start = time.perf_counter()
        with h5py.File(path, "w") as f:
            stored = f.create_dataset("x", data=comps, chunks=(min(comps.size, 1 << 24),), **opts).id.get_storage_size()
        c = time.perf_counter() - start
        start = time.perf_counter()
        with h5py.File(path, "r") as f:
            y = f["x"][()]
        d = time.perf_counter() - start
        res[name] = {"ratio": comps.nbytes / stored, "compress_MBps": comps.nbytes / c / 1e6,
                     "decompress_MBps": comps.nbytes / d / 1e6,
                     "max_error": float(np.abs(y.astype(np.float64) - comps).max())}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qstage", required=True)
    ap.add_argument("--bench", required=True, help="qstage_bench")
    ap.add_argument("--plugin", required=True, help="directory of libh5z_qstage.so")
    ap.add_argument("--work", required=True)
    ap.add_argument("--cases", default="qaoa22,qaoa20p4")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--bounds", default="1e-2,5e-3,1e-3")
    ap.add_argument("--peers", action="store_true")
    ap.add_argument("--pipelines", default=",".join(PIPELINES))
    args = ap.parse_args()
    os.environ["HDF5_PLUGIN_PATH"] = args.plugin
    Path(args.work).mkdir(parents=True, exist_ok=True)
    bounds = [float(b) for b in args.bounds.split(",")]
    report = {"cases": {}}
    for name in args.cases.split(","):
        run_dir = build(args, name, CASES[name])
        net, tensors, ssa, qstage_value = load(run_dir)
        contraction = Contraction(net, tensors, ssa)
        start = time.perf_counter()
        exact, step, big = contraction.run(keep_largest=True)
        log(f"{name}: value {exact:.12g} (qstage {qstage_value:.12g}); largest "
            f"intermediate {big.size} values at step {step} of {len(ssa)} ({time.perf_counter() - start:.1f} s)")
        x = np.ascontiguousarray(big, dtype=np.complex64)
        data = Path(args.work) / f"{name}-tensor.h5"
        import h5py
        with h5py.File(data, "w") as f:
            f["tensor"] = x
        measured = subprocess.run([args.bench, "codec", "--data", f"{data}:tensor", "--device", args.device,
                                   "--bounds", args.bounds, "--pipelines", args.pipelines],
                                  check=True, capture_output=True, text=True)
        for r in json.loads(measured.stdout)["results"]:  # on stderr too, in case a later part runs out of time
            d = r["device_only"]
            log(f"  codec {r['pipeline']} {r['bound']}: ratio {r['ratio']:.1f}, device-only GB/s "
                f"{d['compress_GBps']:.0f} / {d['decompress_GBps']:.0f}, fidelity {r['fidelity']:.6f}")
        comps = x.view(np.float32)
        value_range = float(comps.max()) - float(comps.min())
        res = {"values": int(x.size), "log2_values": float(np.log2(x.size)), "step": step,
               "exact": [exact.real, exact.imag], "qstage_tn_contract": [qstage_value.real, qstage_value.imag],
               "range": value_range,
               "below_1e-3_of_range": float(np.mean(np.abs(comps) <= 1e-3 * value_range)),
               "codec": json.loads(measured.stdout)["results"], "energy": [], "peers": {}}
        for pipeline in args.pipelines.split(","):
            for bound in bounds:
                decoded, stored = through_plugin(Path(args.work) / "plugin.h5", x, pipeline, bound * value_range)
                changed = contraction.run(replace=(step, decoded))
                # <ZZ> is real: its change is the real part's; an amplitude's is complex.
                change = abs(changed.real - exact.real) if "qaoa" in CASES[name] else abs(changed - exact)
                res["energy"].append({"pipeline": pipeline, "bound": bound, "ratio": x.nbytes / stored,
                                      "value": [changed.real, changed.imag], "relative_change": change / abs(exact),
                                      "term_change": change / 2})
                log(f"  {pipeline} {bound}: value {changed:.8g}, relative change "
                    f"{res['energy'][-1]['relative_change']:.2e}, ratio {res['energy'][-1]['ratio']:.1f}")
        if args.peers:
            for bound in bounds:
                res["peers"][str(bound)] = peers(Path(args.work) / "peer.h5", x, bound * value_range)
                log(f"  peers {bound}: " + ", ".join(f"{k} ratio {v['ratio']:.1f}" for k, v in res["peers"][str(bound)].items()))
        report["cases"][name] = res
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
