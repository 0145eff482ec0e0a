"""The compute modes (full, tf32, 3xtf32, bf16) of tn.contract and tensor.matmul.

tn.contract: a chain of large matrices, whose
every step is compute-bound and so runs in the mode, contracted in each mode against
numpy in complex128. Each mode's error lands in its band (3xTF32 at FP32's level, TF32 about
2^-11, BF16 about 2^-8), the reference check measures that same error, and the output says which
steps ran reduced. On cpu the operands are rounded the same way (the CPU twin), so the bands hold
on either backend."""
import json

import h5py
import numpy as np
import pytest

from conftest import DEVICE, chain_spec, committed_run, one_line_error, run, write_spec
from test_tn_hyperindices import einsum_of_network

EXPRESSION = "ab,bc,cd,de->ae"
SIZES = "{a: 96, b: 160, c: 160, d: 160, e: 96}"


def spec(compute, precision="complex64", extra=""):
    return f"""name: compute
steps:
  - id: net
    stage: tn.build
    params: {{einsum: {{expression: "{EXPRESSION}", sizes: {SIZES}, seed: 4}}}}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{max_tries: 16, seed: 0}}
  - id: plan
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{precision: {precision}, budget: 64MiB}}
  - id: value
    stage: tn.contract
    inputs: {{network: net, plan: plan}}
    params: {{compute: {compute}{extra}}}
"""


def contracted(tmp, compute, extra=""):
    _, run_dir = committed_run(tmp / (compute + extra.replace(" ", "").replace(":", "").replace(",", "")), spec(compute, extra=extra))
    want, _ = einsum_of_network(run_dir)
    with h5py.File(run_dir / "outputs" / "value.h5") as f:
        got = f["value"][()].reshape(-1)
        attrs = dict(f.attrs)
    return np.linalg.norm(got - want) / np.linalg.norm(want), attrs


def test_each_mode_gives_its_error_and_measures_it(tmp):
    error, attrs = {}, {}
    for mode in ["full", "tf32", "3xtf32", "bf16"]:
        error[mode], attrs[mode] = contracted(tmp, mode)
        a = attrs[mode]
        assert a["compute"] == mode
        if mode == "full":
            assert "reduced_steps" not in a and "reference_relative_error" not in a
            continue
        reduced = json.loads(a["reduced_steps"])
        assert reduced["steps"] == 3 and reduced["flop_fraction"] == 1.0 and reduced["staging_bytes"] > 0, reduced
        if mode in ("tf32", "bf16"):  # the error model's prediction (kernels::predicted_relative_error)
            assert 0.5 < error[mode] / reduced["predicted_relative_error"] < 2, (mode, reduced, error[mode])
        # The reference check (on by default in a reduced mode) measures the error numpy sees.
        measured = a["reference_relative_error"]
        assert abs(measured - error[mode]) <= 0.05 * error[mode] + 1e-7, (mode, measured, error[mode])
    print({m: f"{e:.2e}" for m, e in error.items()})
    assert error["full"] < 1e-5
    assert error["3xtf32"] < 4 * error["full"] + 1e-7
    assert 20 * error["3xtf32"] < error["tf32"] < 3e-3
    assert 4 * error["tf32"] < error["bf16"] < 3e-2


def test_a_reduced_mode_needs_a_complex64_plan(tmp):
    path = write_spec(tmp / "spec.yaml", spec("tf32", precision="complex128"))
    one_line_error(run(["run", path, "--run-dir", tmp / "run", "--device", DEVICE]), "compute", "complex64")


def test_an_unknown_mode_is_refused(tmp):
    path = write_spec(tmp / "spec.yaml", spec("fp8"))
    r = run(["run", path, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 2 and "compute" in r.err, r


def matmul_outputs(tmp, compute, ranks):
    """psi (3000 x 200) . gate (200 x 150) streamed in 4 chunks of rows, on `ranks` ranks."""
    text = chain_spec("mm", 3000, 200, 150, 7, "{}", chunk_rows=750)
    text = text.replace("inputs: {a: psi, b: gate}", f"inputs: {{a: psi, b: gate}}\n    params: {{compute: {compute}}}")
    path = write_spec(tmp / f"{compute}-{ranks}.yaml", text)
    run_dir = tmp / f"run-{compute}-{ranks}"
    r = run(["run", path, "--run-dir", run_dir, "--device", DEVICE], mpi=ranks if ranks > 1 else 0)
    assert r.code == 0, r
    out = {}
    for name in ["psi", "gate", "applied"]:
        with h5py.File(run_dir / "outputs" / f"{name}.h5") as f:
            out[name] = f["data"][()]
    return out


def test_matmul_modes_give_their_error_and_the_same_bytes_on_two_ranks(tmp):
    error = {}
    for mode in ["full", "tf32", "3xtf32", "bf16"]:
        one = matmul_outputs(tmp, mode, 1)
        want = one["psi"].astype(np.complex128) @ one["gate"].astype(np.complex128)
        error[mode] = np.linalg.norm(one["applied"] - want) / np.linalg.norm(want)
        if mode in ("3xtf32", "bf16"):
            two = matmul_outputs(tmp, mode, 2)
            assert two["applied"].tobytes() == one["applied"].tobytes(), mode
    print({m: f"{e:.2e}" for m, e in error.items()})
    assert error["full"] < 1e-6
    assert error["3xtf32"] < 4 * error["full"] + 1e-7
    assert 20 * error["3xtf32"] < error["tf32"] < 3e-3
    assert 4 * error["tf32"] < error["bf16"] < 3e-2


def test_matmul_refuses_a_reduced_mode_in_double_precision(tmp):
    text = chain_spec("mm", 64, 16, 8, 7, "{}").replace("dtype: complex64", "dtype: complex128")
    text = text.replace("inputs: {a: psi, b: gate}", "inputs: {a: psi, b: gate}\n    params: {compute: bf16}")
    path = write_spec(tmp / "spec.yaml", text)
    one_line_error(run(["run", path, "--run-dir", tmp / "run", "--device", DEVICE]), "compute", "complex128")


@pytest.mark.parametrize("max_error,chosen", [(1e-2, "bf16"), (1e-3, "tf32"), (1e-5, "3xtf32"), (1e-6, "full"),
                                              (1e-8, "full")])
def test_auto_picks_the_fastest_mode_within_max_error(tmp, max_error, chosen):
    error, a = contracted(tmp, "auto", f", max_error: {max_error}")
    assert a["compute"] == chosen and a["compute_requested"] == "auto" and a["max_error"] == max_error
    if chosen != "full":
        assert error < max_error and "max_error_exceeded" not in a, (error, a)


def test_a_result_over_max_error_says_so(tmp):
    error, a = contracted(tmp, "bf16", ", max_error: 1.0e-4")
    assert error > 1e-4 and a["max_error_exceeded"] == 1
    log = (tmp / "bf16max_error1.0e-4" / "run" / "logs").glob("*")
    assert any("exceeds max_error" in p.read_text() for p in log if p.is_file())


def test_auto_needs_max_error(tmp):
    path = write_spec(tmp / "spec.yaml", spec("auto"))
    one_line_error(run(["run", path, "--run-dir", tmp / "run", "--device", DEVICE]), "auto", "max_error")


def test_a_plan_that_fills_the_device_still_runs_in_a_reduced_mode(tmp):
    """tn.plan's default budget fills the device in full precision; the staging of a reduced mode
    then takes what the slots have left, and the products are tiled finer: the same values within
    FP32's error, less staging."""
    text = spec("3xtf32").replace(", budget: 64MiB", "").replace(EXPRESSION, "ab,bc,cd->ad").replace(
        SIZES, "{a: 512, b: 512, c: 512, d: 512}")
    path = write_spec(tmp / "spec.yaml", text)
    values, staging = {}, {}
    # (the same room for the slots on either backend: a GPU's three BLAS streams hold 8 MiB of cuBLAS
    # workspace each, which the plan takes out of the budget first)
    small = "64MiB" if DEVICE == "cuda" else "40MiB"
    for memory in [small, "1GiB"]:
        r = run(["run", path, "--run-dir", tmp / memory, "--device", DEVICE, "--device-memory", memory])
        assert r.code == 0, r
        with h5py.File(tmp / memory / "outputs" / "value.h5") as f:
            values[memory] = f["value"][()]
            reduced = json.loads(f.attrs["reduced_steps"])
            staging[memory] = reduced["staging_bytes"]
            # FP32's error on the CPU twin (FP32 sums of the split operands); on a GPU the tensor
            # cores' accumulation, which the error model states (kernels/linalg/gemm.hpp)
            bound = 1e-6 if DEVICE == "cpu" else reduced["predicted_relative_error"]
            error = f.attrs["reference_relative_error"]
            # (the complex128 reference check runs after the contraction in what it left, which on a
            # GPU under the small budget may be too little: then the output says so, and the values
            # are held to the large budget's below)
            assert error < bound or (memory == small and np.isnan(error) and "not measured" in f.attrs["reference_note"]), \
                (memory, error, bound)
    assert staging[small] < staging["1GiB"], staging
    # (finer tiles: the same sums on the CPU; on a GPU cuBLAS may pick other kernels for them)
    assert np.linalg.norm(values[small] - values["1GiB"]) < bound * np.linalg.norm(values["1GiB"])
