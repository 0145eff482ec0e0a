"""mps.tebd's precision: complex64 runs the two-site updates in single precision. An XXZ quench and
a Bose-Hubbard quench in complex64 agree with complex128 within 1e-5 (densities, norm, energy,
entropies) yet differ from it (single precision really ran); precision_check's datasets (the
deviation from a complex128 evolution run alongside) equal the differences of two separate runs,
complex64 and complex128, within 1e-12, and the check leaves the complex64 results' bits
unchanged; a stopped and resumed precision_check run gives the bits of a clean one (the
checkpoints carry the shadow state); bad values exit 2."""
import hashlib
import random
import re

import h5py
import numpy as np
import pytest

from conftest import DEVICE, one_line_error, run, write_spec
from test_mps_resume import LONG, spec, stop_when_committed

XXZ = "{{J: 1, delta: 0.7, h: 0.1, dt: 0.05, steps: 30, measure_every: 3, trunc: {{chi_max: 24, svd_min: 1.0e-10}}{extra}}}"
BH = "{{model: bose_hubbard, J: 1, U: 2, mu: 0.3, dt: 0.05, steps: 20, measure_every: 2, trunc: {{chi_max: 32, svd_min: 1.0e-6}}{extra}}}"
C64 = ", precision: complex64"
CHECK = ", precision: complex64, precision_check: true"
SERIES = ("density", "entropy_vN", "norm", "energy", "truncation_error")


def tebd(id, state, params):
    return f"  - id: {id}\n    stage: mps.tebd\n    inputs: {{state: {state}}}\n    params: {params}\n"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """One workflow: a random XXZ state and a Bose-Hubbard Fock state, each evolved in complex128,
    complex64 and complex64 with precision_check; returns {step: {dataset: values, attrs...}}."""
    tmp = tmp_path_factory.mktemp("precision")
    steps = ("  - id: psi\n    stage: mps.init\n    params: {L: 16, d: 2, state: random, total_charge: 8, chi: 8, seed: 3}\n"
             "  - id: bosons\n    stage: mps.init\n    params: {L: 8, d: 4, state: fock, occupations: [2, 0, 1, 1, 2, 0, 1, 1]}\n")
    for name, state, params in (("xxz", "psi", XXZ), ("bh", "bosons", BH)):
        for suffix, extra in (("128", ""), ("64", C64), ("check", CHECK)):
            steps += tebd(f"{name}{suffix}", state, params.format(extra=extra))
    s = write_spec(tmp / "p.yaml", f"name: p\nsteps:\n{steps}")
    r = run(["run", s, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    out = {}
    for name in ("xxz", "bh"):
        for suffix in ("128", "64", "check"):
            with h5py.File(tmp / "run" / "outputs" / f"{name}{suffix}.h5") as f:
                d = {}
                f.visititems(lambda k, v: d.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
                d["attrs"] = dict(f.attrs)
                d["descriptions"] = {k: f[k].attrs.get("description", "") for k in d if k != "attrs"}
                out[f"{name}{suffix}"] = d
    return out


@pytest.mark.parametrize("name", ["xxz", "bh"])
def test_complex64_agrees_with_complex128_and_is_not_its_bits(outputs, name):
    a, b = outputs[f"{name}64"], outputs[f"{name}128"]
    assert a["attrs"]["precision"] == "complex64" and b["attrs"]["precision"] == "complex128"
    assert np.array_equal(a["chi"], b["chi"]) and np.array_equal(a["bond_charges"], b["bond_charges"])
    for key in ("density", "norm", "energy", "entropy_vN", "charge_distribution"):
        assert np.max(np.abs(a[key] - b[key])) < 1e-5, key
    # single precision ran: the results differ from complex128 far beyond its rounding, yet the
    # particle number is still conserved exactly by the charge blocks (bond 0 holds N alone)
    assert np.max(np.abs(a["density"] - b["density"])) > 1e-9
    assert not np.array_equal(a["values"], b["values"])
    assert a["bond_charges"][0] == b["bond_charges"][0]


@pytest.mark.parametrize("name", ["xxz", "bh"])
def test_precision_error_equals_the_difference_of_two_runs(outputs, name):
    c, a, b = outputs[f"{name}check"], outputs[f"{name}64"], outputs[f"{name}128"]
    # the shadow does not touch the complex64 evolution: its datasets are the plain run's bits
    for key in a:
        if key not in ("attrs", "descriptions"):
            assert np.array_equal(c[key], a[key]), key
    assert "precision_error/density" not in a and c["attrs"]["precision"] == "complex64"
    for key in SERIES:
        err = c[f"precision_error/{key}"]
        diff = np.abs(a[key] - b[key])
        expected = diff.reshape(len(a["times"]), -1).max(axis=1)
        assert err.shape == a["times"].shape
        assert np.max(np.abs(err - expected)) < 1e-12, key
        assert "complex128" in c["descriptions"][f"precision_error/{key}"]
    assert np.max(c["precision_error/density"]) < 1e-5
    assert np.max(c["precision_error/density"]) > 0


def dataset_digests(path):
    out = {}
    with h5py.File(path) as f:
        def visit(name, v):
            if isinstance(v, h5py.Dataset):
                x = np.ascontiguousarray(v[()])
                out[name] = hashlib.sha256(x.tobytes() + str((x.dtype, x.shape)).encode()).hexdigest()
        f.visititems(visit)
    return out


def test_a_stopped_precision_check_run_resumes_with_the_bits_of_a_clean_one(tmp_path):
    params = LONG.replace("steps: 120", "steps: 60")
    extra = CHECK + ", checkpoint_every: 3"
    clean_dir = tmp_path / "clean" / "run"
    r = run(["run", spec(tmp_path / "clean", params, extra), "--run-dir", clean_dir, "--device", DEVICE])
    assert r.code == 0, r
    clean = dataset_digests(clean_dir / "outputs" / "evo.h5")
    assert "precision_error/density" in clean
    run_dir = tmp_path / "stopped" / "run"
    args = ["run", spec(tmp_path / "stopped", params, extra), "--run-dir", run_dir, "--device", DEVICE]
    stops = 0
    for attempt in range(4):
        code, err = stop_when_committed(args, run_dir, random.Random(attempt).uniform(0, 0.2))
        if code == 0:
            break
        assert code == 75, err
        stops += 1
        args = ["resume", run_dir, "--device", DEVICE]
    else:
        r = run(args)
        assert r.code == 0, r
    if stops == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert re.search(r"resuming after time step [1-9]", (run_dir / "logs" / "rank-0.log").read_text())
    assert dataset_digests(run_dir / "outputs" / "evo.h5") == clean


@pytest.mark.parametrize("params,fragments", [
    ("{J: 1, dt: 0.05, steps: 2, precision: complex32}", ["precision"]),
    ("{J: 1, dt: 0.05, steps: 2, precision_check: true}", ["precision_check", "complex64"]),
])
def test_bad_precision_is_refused(tmp_path, params, fragments):
    s = write_spec(tmp_path / "bad.yaml", "name: bad\nsteps:\n"
                   "  - id: psi\n    stage: mps.init\n    params: {L: 8, state: neel}\n" + tebd("evo", "psi", params))
    one_line_error(run(["run", s, "--run-dir", tmp_path / "run", "--device", DEVICE]), *fragments)
