#!/usr/bin/python3
"""Bitwise before/after check for redesigns that must not change any output (issue 17).

Runs workflows with one qstage build and records a digest of every dataset of every output
file; runs them again with another build and compares. Compressed datasets are digested by
their stored chunk bytes (read_direct_chunk), not by decoded values, so a change in the
codec's bytes shows even where the decoded values would agree.

  # record with the old build, then compare the new build against the record
  tests/bitwise_digests.py record --qstage /tmp/old/qstage --out old.json
  tests/bitwise_digests.py record --qstage build/qstage --out new.json
  tests/bitwise_digests.py compare old.json new.json

  # both at once, on the GPU (extra specs, e.g. a benchmark's, after --spec)
  tests/bitwise_digests.py both --old /tmp/old/qstage --new build/qstage --device cuda \\
      --spec bench/some.yaml

Exit 0 if every digest agrees, 1 if any differs (each difference listed), 2 on bad use.
Attributes that describe a run rather than its result (times, peaks, device, attempts,
dates) are left out, and so are measurements wherever they are stored (attributes, datasets or
keys of JSON documents named like *seconds*, *per_second*, *gbps*: a plan records the rates it
measured). The results' own attributes (checksums, summaries of values) are kept.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# Attributes of the run, not of its result: they differ between any two runs.
VOLATILE = {"qstage.wall_seconds", "qstage.attempts", "qstage.peak_device_bytes", "qstage.peak_host_bytes",
            "qstage.created", "qstage.device", "qstage.version", "qstage.backend", "qstage.ranks",
            "qstage.inputs",
            # a hash of the inputs' content, which for a step after tn.plan includes the rates the
            # plan measured (its datasets are compared without them)
            "qstage.step_key"}
# Names of measurements (times, rates, memory peaks and what is predicted from measured rates): attributes,
# datasets and keys of JSON documents with such names are left out.
MEASURED = re.compile(r"seconds|per_second|gbps|bandwidth|gemm_flops|gemm_rate|slicing_overhead|measured|peak_")


def stable_json(value):
    """A JSON document without its measured keys, or None if `value` is not JSON."""
    try:
        doc = json.loads(value)
    except (ValueError, TypeError):
        return None

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if not MEASURED.search(k)}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return json.dumps(strip(doc), sort_keys=True)


def attribute_text(value):
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        return stable_json(value) or value
    if isinstance(value, np.ndarray):
        return hashlib.sha256(value.tobytes()).hexdigest() + str(value.dtype) + str(value.shape)
    return repr(value)


def kept(name):
    return name not in VOLATILE and not MEASURED.search(name)


def dataset_digest(d):
    """sha256 of a dataset's stored chunks (filtered), of its JSON text without measurements, or
    of its values."""
    h = hashlib.sha256()
    text = None
    if d.chunks is not None and len(d._filters) > 0:
        h.update(f"{d.dtype}|{d.shape}|{d.chunks}|{tuple(d._filters)}".encode())
        for i in range(d.id.get_num_chunks()):
            info = d.id.get_chunk_info(i)
            _, data = d.id.read_direct_chunk(info.chunk_offset)
            h.update(repr(info.chunk_offset).encode())
            h.update(data)
    elif d.shape is not None and d.size > 0:
        values = np.ascontiguousarray(d[()])
        text = stable_json(values.tobytes()) if values.dtype == np.uint8 and values.ndim == 1 else None
        if text is not None:  # (its length changes with the digits of what it measured)
            h.update(b"json|" + text.encode())
        else:
            h.update(f"{d.dtype}|{d.shape}|{d.chunks}".encode() + values.tobytes())
    else:
        h.update(f"{d.dtype}|{d.shape}|{d.chunks}".encode())
    for k in sorted(d.attrs.keys()):
        if kept(k) and not (text is not None and k == "qsum64"):  # (a JSON text's checksum covers what it measured)
            h.update(f"{k}={attribute_text(d.attrs[k])}".encode())
    return h.hexdigest()


def file_digests(path):
    out = {}
    with h5py.File(path, "r") as f:
        for k in sorted(f.attrs.keys()):
            if kept(k):
                out[f"/@{k}"] = hashlib.sha256(attribute_text(f.attrs[k]).encode()).hexdigest()

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and kept(name.rsplit("/", 1)[-1]):
                out[name] = dataset_digest(obj)
        f.visititems(visit)
    return out


def default_specs():
    return sorted(str(p) for p in (ROOT / "workflows").glob("*.yaml"))


def record(qstage, specs, device, extra_args, work):
    digests = {}
    env = dict(os.environ)
    for spec in specs:
        run_dir = Path(work) / Path(spec).stem
        cmd = [qstage, "run", spec, "--run-dir", str(run_dir), "--device", device, "--log-level", "warn", *extra_args]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"bitwise_digests: {' '.join(cmd)} failed with exit {proc.returncode}:\n{proc.stderr[-2000:]}")
        for out in sorted((run_dir / "outputs").glob("*.h5")):
            for name, digest in file_digests(out).items():
                digests[f"{Path(spec).stem}/{out.stem}:{name}"] = digest
        print(f"  {Path(spec).name}: {len(list((run_dir / 'outputs').glob('*.h5')))} outputs", file=sys.stderr)
    return digests


def compare(a, b, label_a="old", label_b="new"):
    differ = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    for k in differ:
        print(f"differs: {k} ({label_a} {a.get(k, 'missing')[:16]}, {label_b} {b.get(k, 'missing')[:16]})")
    print(f"{len(set(a) | set(b)) - len(differ)} digests agree, {len(differ)} differ")
    return 1 if differ else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("record", "both"):
        p = sub.add_parser(name)
        if name == "record":
            p.add_argument("--qstage", required=True, help="the qstage binary")
            p.add_argument("--out", required=True, help="JSON file for the digests")
        else:
            p.add_argument("--old", required=True, help="the qstage binary before the change")
            p.add_argument("--new", required=True, help="the qstage binary after the change")
        p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
        p.add_argument("--spec", action="append", default=[], help="extra workflow specs (default: workflows/*.yaml)")
        p.add_argument("--only-extra", action="store_true", help="run the --spec files alone, not workflows/*.yaml")
        p.add_argument("--work", default=None, help="folder for the run directories (default: a temporary one)")
        p.add_argument("--run-arg", action="append", default=[], help="an extra argument for `qstage run`")
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    args = ap.parse_args()

    if args.command == "compare":
        return compare(json.loads(Path(args.a).read_text()), json.loads(Path(args.b).read_text()), args.a, args.b)
    specs = ([] if args.only_extra else default_specs()) + [str(Path(s).resolve()) for s in args.spec]
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        if args.command == "record":
            d = record(args.qstage, specs, args.device, args.run_arg, work)
            Path(args.out).write_text(json.dumps(d, indent=1, sort_keys=True))
            print(f"{len(d)} digests written to {args.out}")
            return 0
        old = record(args.old, specs, args.device, args.run_arg, Path(work) / "old")
        new = record(args.new, specs, args.device, args.run_arg, Path(work) / "new")
        return compare(old, new)


if __name__ == "__main__":
    sys.exit(main())
