"""Tropical contraction (Liu, Wang and Zhang, PRL 126, 090506 (2021)): tn.build's independent_sets
and spin_glass with `semiring: tropical` (each entry an (exponent, count) pair stored as complex128),
contracted by tn.contract into (the largest exponent, how many configurations reach it): the
maximum independent set's size and the number of maximum independent sets of a King's subgraph,
and -E_0 and the ground-state degeneracy of a +-1 or Gaussian spin glass. The oracle is brute
force over every configuration, written here from the instance the output's attribute 'problem'
describes. Sliced plans (slices add in the semiring) and several ranks give the same bytes as one
unsliced contraction. Also: the spin glass's partition function in the standard semiring."""
import json

import h5py
import numpy as np
import pytest

from conftest import DEVICE, committed_run, one_line_error, run, write_spec
from test_tn_distributed import distributed_run, spec_text


def contracted(run_dir):
    with h5py.File(run_dir / "outputs" / "value.h5") as f:
        out = {"value": f["value"][()].reshape(-1), "attrs": dict(f.attrs)}
        if "exponent" in f:
            out["exponent"], out["count"] = f["exponent"][()].reshape(-1), f["count"][()].reshape(-1)
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        out["about"] = json.loads(f.attrs["problem"])
    return out


def configurations(n):
    """Every assignment of n bits, one per row (n <= 20)."""
    return (np.arange(1 << n)[:, None] >> np.arange(n)[None, :]) & 1


def brute_force_mis(about):
    x = configurations(about["vertices"])
    allowed = np.ones(len(x), dtype=bool)
    for u, v in about["edges"]:
        allowed &= ~((x[:, u] == 1) & (x[:, v] == 1))
    sizes = x[allowed].sum(1)
    return int(sizes.max()), int((sizes == sizes.max()).sum())


def spin_glass_energies(about):
    s = 1 - 2 * configurations(about["rows"] * about["cols"])
    energy = np.zeros(len(s))
    for (u, v), J in zip(about["edges"], about["J"]):
        energy += J * s[:, u] * s[:, v]
    return energy


@pytest.mark.parametrize("rows,cols,fill,seed", [(4, 4, 1.0, 0), (4, 4, 0.8, 3), (5, 4, 0.7, 11), (3, 6, 0.9, 5)])
def test_maximum_independent_sets_equal_brute_force(tmp, rows, cols, fill, seed):
    source = f"independent_sets: {{rows: {rows}, cols: {cols}, fill: {fill}, seed: {seed}, semiring: tropical}}"
    _, run_dir = committed_run(tmp, spec_text(source, "complex128", 1, budget="64MiB"))
    r = contracted(run_dir)
    size, count = brute_force_mis(r["about"])
    assert r["attrs"]["semiring"] == "tropical"
    assert (r["exponent"][0], r["count"][0]) == (size, count)
    assert r["value"][0] == complex(size, count)  # (the pair as stored: exponent + i count)


def test_sliced_tropical_contraction_gives_the_unsliced_bytes(tmp):
    """Slices add in the semiring: a plan sliced to fit 1 KiB gives the unsliced pair exactly."""
    source = "independent_sets: {rows: 5, cols: 5, fill: 0.85, seed: 2, semiring: tropical}"
    _, whole = committed_run(tmp / "whole", spec_text(source, "complex128", 1, budget="64MiB"))
    _, sliced = committed_run(tmp / "sliced", spec_text(source, "complex128", 1, budget="1KiB"))
    a, b = contracted(whole), contracted(sliced)
    assert a["attrs"]["slices"] == 1 and b["attrs"]["slices"] > 1
    assert a["value"].tobytes() == b["value"].tobytes()
    assert (a["exponent"][0], a["count"][0]) == brute_force_mis(a["about"])


def test_tropical_slices_over_two_ranks_give_one_ranks_bytes(tmp):
    source = "spin_glass: {rows: 4, cols: 4, seed: 7, semiring: tropical}"
    one = distributed_run(tmp / "one", spec_text(source, "complex128", 1, budget="1KiB"), 1)
    two = distributed_run(tmp / "two", spec_text(source, "complex128", 1, budget="1KiB"), 2)
    a, b = contracted(one), contracted(two)
    assert a["attrs"]["slices"] > 1
    assert a["value"].tobytes() == b["value"].tobytes()


@pytest.mark.parametrize("rows,cols,seed", [(3, 4, 2), (4, 4, 7), (2, 7, 1)])
def test_pm1_spin_glass_ground_states_equal_brute_force(tmp, rows, cols, seed):
    source = f"spin_glass: {{rows: {rows}, cols: {cols}, seed: {seed}, semiring: tropical}}"
    _, run_dir = committed_run(tmp, spec_text(source, "complex128", 1, budget="64MiB"))
    r = contracted(run_dir)
    energy = spin_glass_energies(r["about"])
    e0 = energy.min()
    assert r["exponent"][0] == -e0
    assert r["count"][0] == np.count_nonzero(energy == e0)


def test_gaussian_spin_glass_ground_state_equals_brute_force(tmp):
    _, run_dir = committed_run(tmp, spec_text("spin_glass: {rows: 3, cols: 5, seed: 4, couplings: gaussian, "
                                              "semiring: tropical}", "complex128", 1, budget="64MiB"))
    r = contracted(run_dir)
    energy = spin_glass_energies(r["about"])
    assert abs(r["exponent"][0] + energy.min()) <= 1e-12 * abs(energy.min())
    assert r["count"][0] == 2  # (a ground state and its global flip; ties elsewhere have probability 0)


def test_spin_glass_partition_function_equals_brute_force(tmp):
    _, run_dir = committed_run(tmp, spec_text("spin_glass: {rows: 3, cols: 4, seed: 9, couplings: gaussian, beta: 0.7}",
                                              "complex128", 1, budget="64MiB"))
    r = contracted(run_dir)
    z = np.exp(-0.7 * spin_glass_energies(r["about"])).sum()
    assert "semiring" not in r["attrs"] and "exponent" not in r
    assert abs(r["value"][0] - z) <= 1e-12 * z


def tropical_spec(plan_params, contract_params="{}"):
    return f"""name: trop
steps:
  - id: net
    stage: tn.build
    params: {{independent_sets: {{rows: 3, cols: 3, semiring: tropical}}}}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{max_seconds: 1}}
  - id: plan
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {plan_params}
  - id: value
    stage: tn.contract
    inputs: {{network: net, plan: plan}}
    params: {contract_params}
"""


def test_a_tropical_network_planned_in_complex64_is_refused(tmp):
    tmp.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp / "spec.yaml", tropical_spec("{precision: complex64}"))
    one_line_error(run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE]), "tropical", "precision",
                   "expected complex128")


def test_a_reduced_compute_mode_on_a_tropical_network_is_refused(tmp):
    tmp.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp / "spec.yaml", tropical_spec("{precision: complex128}", "{compute: tf32}"))
    one_line_error(run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE]), "tropical", "compute")
