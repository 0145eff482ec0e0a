"""mps.tebd on the GPU against the CPU: the same quench on both backends, from a random state with
a field (no exactly degenerate Schmidt values, so both cut the same indices), agrees within
1e-10 untruncated and within 1e-8 truncated; the charge is conserved exactly on both. Runs where
QSTAGE_TEST_DEVICE=cuda (the GPU machine); CI has no GPU and skips them."""
import h5py
import numpy as np
import pytest

from conftest import DEVICE, run, write_spec

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU (QSTAGE_TEST_DEVICE=cuda)")


def quench(tmp, device, chi_max, gpu_svd_from=320, precision="complex128", svd_min=1e-12):
    spec = write_spec(tmp / f"q-{device}-{chi_max}-{gpu_svd_from}-{precision}-{svd_min}.yaml", f"""name: q
steps:
  - id: psi
    stage: mps.init
    params: {{L: 20, d: 2, state: random, total_charge: 10, chi: 16, seed: 11}}
  - id: evo
    stage: mps.tebd
    inputs: {{state: psi}}
    params: {{J: 1, delta: 0.7, h: 0.2, dt: 0.05, steps: 20, order: 2, gpu_svd_from: {gpu_svd_from}, precision: {precision}, trunc: {{chi_max: {chi_max}, svd_min: {svd_min}}}}}
""")
    run_dir = tmp / f"run-{device}-{chi_max}-{gpu_svd_from}-{precision}-{svd_min}"
    r = run(["run", spec, "--run-dir", run_dir, "--device", device])
    assert r.code == 0, r.err
    with h5py.File(run_dir / "outputs" / "evo.h5") as f:
        return {k: f[k][()] for k in ("density", "entropy_vN", "charge_distribution", "norm", "energy", "chi",
                                       "truncation_error", "bond_charges", "lambda")}


# gpu_svd_from 0 sends every charge block to cuSOLVER's Jacobi SVD; the default sends these
# small ones to the host, so only Theta and C Y^dagger run on the GPU. The truncated case keeps
# the host's SVDs: Jacobi's values differ in the last digits, and where two Schmidt values of
# different blocks tie that closely at the cut, the backends keep different indices.
@pytest.mark.parametrize("chi_max,tol,gpu_svd_from", [(1000, 1e-10, 0), (1000, 1e-10, 320), (24, 1e-8, 320)])
def test_cpu_and_gpu_agree(tmp_path, chi_max, tol, gpu_svd_from):
    cpu = quench(tmp_path, "cpu", chi_max)
    gpu = quench(tmp_path, "cuda", chi_max, gpu_svd_from)
    assert np.array_equal(cpu["chi"], gpu["chi"]) and np.array_equal(cpu["bond_charges"], gpu["bond_charges"])
    for key in ("density", "entropy_vN", "charge_distribution", "norm", "energy", "lambda"):
        assert np.max(np.abs(cpu[key] - gpu[key])) < tol, key
    assert abs(cpu["truncation_error"][-1] - gpu["truncation_error"][-1]) < tol
    # The charge is exact: bond 0 holds N = 10 alone, and untruncated the densities sum to it. (After
    # cuts, B' = C Y^dagger / norm is right-canonical only approximately and the B-form densities
    # drift, 4e-6 here on both backends alike: compared above, not against N.)
    for out in (cpu, gpu):
        assert out["bond_charges"][0] == 10 and out["bond_charges"][-1] == 0
        if chi_max >= 1000:
            assert np.max(np.abs(out["density"].sum(axis=1) - 10)) < 1e-10
    if chi_max < 100:
        assert cpu["truncation_error"][-1] > 0, "the truncated case must truncate"


# complex64 (cublasCgemm, cusolverDnCgesvdj; the host's share by cgesdd) against the CPU's complex64
# (cgemm, cgesdd): both carry single-precision rounding, in different orders, so they agree only to
# float's precision (the CPU's complex64 error: docs/mps.md, Precision), and each with complex128.
# svd_min 1e-6, as docs/mps.md advises for complex64: below it Schmidt values are float's rounding
# noise, which each backend keeps differently. cuSOLVER's float Jacobi is less accurate than the
# host's cgesdd: on an H200 (2026-11-27) every block on Jacobi gave 6e-5 on densities and 1.6e-4 on
# entropies against complex128 (the host's blocks: 1.4e-6 and 5.7e-6), hence its looser bound.
@pytest.mark.parametrize("gpu_svd_from,tol", [(0, 5e-4), (320, 1e-4)])
def test_complex64_cpu_and_gpu_agree(tmp_path, gpu_svd_from, tol):
    cpu = quench(tmp_path, "cpu", 1000, precision="complex64", svd_min=1e-6)
    gpu = quench(tmp_path, "cuda", 1000, gpu_svd_from, precision="complex64", svd_min=1e-6)
    ref = quench(tmp_path, "cpu", 1000, svd_min=1e-6)
    for key in ("density", "entropy_vN", "charge_distribution", "norm", "energy"):
        assert np.max(np.abs(cpu[key] - gpu[key])) < tol, key
        assert np.max(np.abs(gpu[key] - ref[key])) < tol, key
    assert not np.array_equal(gpu["density"], ref["density"]), "single precision ran"
    assert gpu["bond_charges"][0] == 10
