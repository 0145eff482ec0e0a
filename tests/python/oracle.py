"""Independent re-implementations of qstage's documented formulas (numpy only), used by the
tests as oracles: the random stream of tensor.random, the qsum64 checksum, the stats,
numpy.einsum of a tn.build network, and an FCIDUMP's lines as written."""
import json
from pathlib import Path

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M64 = (1 << 64) - 1


def _mix(z, a, b, s1, s2, s3):
    z = z.copy()
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(s1)
        z *= np.uint64(a)
        z ^= z >> np.uint64(s2)
        z *= np.uint64(b)
        z ^= z >> np.uint64(s3)
    return z


def splitmix64(z):
    return _mix(np.asarray(z, dtype=np.uint64), 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 30, 27, 31)


def fmix64(z):
    return _mix(np.asarray(z, dtype=np.uint64), 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 33, 33, 33)


def random_tensor(shape, dtype, seed):
    """tensor.random: component j = splitmix64(splitmix64(seed) + (j+1)*golden), mapped to [-1, 1)."""
    dtype = np.dtype(dtype)
    complex_ = dtype.kind == "c"
    n = int(np.prod(shape)) * (2 if complex_ else 1)
    key = splitmix64(np.array([seed], dtype=np.uint64))[0]
    j = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = splitmix64(key + j * GOLDEN)
    single = dtype in (np.complex64, np.float32)
    if single:
        comp = (bits >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -23) - np.float32(1)
        base = np.float32
    else:
        comp = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -52 - 1.0
        base = np.float64
    comp = comp.astype(base)
    if complex_:
        return comp.view(dtype).reshape(shape)
    return comp.reshape(shape)


def qsum64(array):
    """qsum64: sum over 4-byte little-endian words w_i of fmix64(w_i ^ ((i+1)*golden)) mod 2^64."""
    a = np.ascontiguousarray(array)
    w = np.frombuffer(a.tobytes(), dtype="<u4").astype(np.uint64)
    i = np.arange(1, w.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        terms = fmix64(w ^ (i * GOLDEN))
    return int(terms.sum(dtype=np.uint64))


def stats(array):
    a = np.asarray(array)
    comps = a.view(a.real.dtype) if np.iscomplexobj(a) else a
    finite_el = np.isfinite(a) if not np.iscomplexobj(a) else (np.isfinite(a.real) & np.isfinite(a.imag))
    f = a[finite_el]
    fc = f.view(f.real.dtype) if np.iscomplexobj(f) else f
    return {
        "sum_sq": float(np.sum(np.abs(f.astype(np.complex128 if np.iscomplexobj(f) else np.float64)) ** 2)),
        "min": float(fc.min()) if fc.size else float("nan"),
        "max": float(fc.max()) if fc.size else float("nan"),
        "max_abs": float(np.abs(f).max()) if f.size else 0.0,
        "nonfinite": int(a.size - f.size),
        "count": int(a.size),
        "checksum": qsum64(a),
    }


def spiky(rng, n):
    """Normal values under an envelope of narrow bumps and a few spikes: many values near 0."""
    i = np.arange(n)
    envelope = np.exp(-(((i % 700) - 350) / 30.0) ** 2) + 1e-5
    envelope[rng.random(n) < 0.003] = 50.0
    return (rng.standard_normal(n) * envelope).astype(np.float32)


def network_einsum(net_h5):
    """numpy.einsum of the network in a tn.build output (its tensors and modes), flattened: the
    value tn.contract computes for a generic network."""
    import h5py
    with h5py.File(net_h5) as f:
        net = json.loads(bytes(f["network"][()]).decode())
        tensors = [f["tensors"][n][()] for n in sorted(f["tensors"])]
    extents = {int(k): v for k, v in net["size_dict"].items()}
    letters = "abcdefghijklmnopqrstuvwxyz"
    shaped = [t.reshape([extents[m] for m in modes]) for t, modes in zip(tensors, net["inputs"])]
    expr = ",".join("".join(letters[m] for m in modes) for modes in net["inputs"]) + "->" + \
        "".join(letters[m] for m in net["output"])
    return np.asarray(np.einsum(expr, *shaped)).reshape(-1)


def fcidump_lines(path):
    """An FCIDUMP's namelist header (whitespace collapsed, upper case, through the line that ends it:
    '&END', '$END' or '/') and its value lines as token lists, every line as written (readers such as
    pyscf.tools.fcidump.read fold repeated and symmetric lines into arrays)."""
    text = Path(path).read_text().splitlines()
    end = next(i for i, l in enumerate(text) if "&END" in l.upper() or "/" in l)
    return " ".join(" ".join(text[:end + 1]).split()).upper(), [l.split() for l in text[end + 1:] if l.strip()]
