"""Tensor-network stages end to end: tn.build -> tn.path -> tn.plan -> tn.contract against the
independent oracle tn.statevector (and numpy.einsum for generic networks). Tolerances (stated in
the issue): 1e-5 relative in complex64, 1e-12 in complex128."""
import json
import os

import h5py
import numpy as np
import pytest

from conftest import DEVICE, ROOT, committed_run, manifest, one_line_error, read_png_rgb, run, write_spec
from oracle import network_einsum

DATA = ROOT / "tests" / "data" / "circuits"


def contract_steps(plan_params, path_params="max_seconds: 600, max_tries: 64", suffix="", result="amps"):
    """tn.path, tn.plan (fixed eq. 6 rates, so plans are the same on every machine) and
    tn.contract steps for the network of step net{suffix}."""
    return f"""
  - id: path{suffix}
    stage: tn.path
    inputs: {{network: net{suffix}}}
    params: {{{path_params}}}
  - id: plan{suffix}
    stage: tn.plan
    inputs: {{network: net{suffix}, path: path{suffix}}}
    params: {{{plan_params}, bandwidth: 1.0e10, gemm_rate: 1.0e11}}
  - id: {result}{suffix}
    stage: tn.contract
    inputs: {{network: net{suffix}, plan: plan{suffix}}}
"""


def circuit_steps(source, bits, precision, budget, path_seed=0, suffix="", path=None):
    """path: an SSA path file to import instead of searching (tests of what a plan does on a
    given path, which another search's path may not need)."""
    path_params = f"import: {path}, format: ssa" if path else f"max_seconds: 600, max_tries: 64, seed: {path_seed}"
    return f"""
  - id: net{suffix}
    stage: tn.build
    params: {{{source}, {bits}}}""" + contract_steps(f"precision: {precision}, budget: {budget}", path_params,
                                                    suffix) + f"""\
  - id: sv{suffix}
    stage: tn.statevector
    params: {{{source}, {bits}, precision: {precision}}}
"""


# The 4 x 5 x 8 circuit's path (tn.path, seed 0, 64 tries, refining 8 trees), imported by the
# out-of-core tests: they check spilling and blocks on it, which another search's path may not need.
OOC_PATH = ROOT / "tests" / "data" / "paths" / "random_4x5x8_seed3.ssa.json"


def relative_error(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def amplitudes(run_dir, step):
    with h5py.File(run_dir / "outputs" / f"{step}.h5") as f:
        return f["amplitudes"][()], f["bitstrings"][()]


# Budgets are about a quarter of each plan's unsliced arena, so every case is sliced.
@pytest.mark.parametrize("source,precision,tol,budget", [
    ("random: {rows: 3, cols: 4, cycles: 8, seed: 1}", "complex64", 1e-5, "8KiB"),
    ("random: {rows: 4, cols: 4, cycles: 10, seed: 2, gate: cz}", "complex128", 1e-12, "128KiB"),
    ("random: {rows: 4, cols: 5, cycles: 8, seed: 3}", "complex128", 1e-12, "1MiB"),
    ("qaoa: {nodes: 14, p: 2, seed: 4}", "complex64", 1e-5, "16KiB"),
    # seed 000's many-body workloads: Trotterized Ising dynamics on three lattices, disordered couplings
    ("lattice: {kind: rectangular, rows: 3, cols: 4, steps: 3, dt: 0.2, disorder: 0.3, seed: 5}", "complex128", 1e-12, "4KiB"),
    ("lattice: {kind: triangular, rows: 3, cols: 3, steps: 3, dt: 0.2, h: 0.7, seed: 6}", "complex128", 1e-12, "4KiB"),
    ("lattice: {kind: hexagonal, rows: 4, cols: 3, steps: 4, dt: 0.15, disorder: 0.5, seed: 7}", "complex64", 1e-5, "2KiB"),
])
def test_contract_matches_statevector(tmp, source, precision, tol, budget):
    spec = "name: tn\nsteps:" + circuit_steps(source, "random_bitstrings: {count: 3, seed: 9}", precision, budget)
    _, run_dir = committed_run(tmp, spec)
    a, bits_a = amplitudes(run_dir, "amps")
    s, bits_s = amplitudes(run_dir, "sv")
    assert (bits_a == bits_s).all() and bits_a.shape[0] == 3
    assert relative_error(a, s) < tol, (a, s)
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        assert f.attrs["slices"] > 1, f"the {budget} budget should force slicing"


@pytest.mark.parametrize("precision,contract_params,low,high", [
    # TF32: the reference check is on by default. (This circuit's steps are all memory-bound: they
    # run in FP32 on either backend; test_tn_compute.py has steps that run in TF32.)
    ("complex64", "compute: tf32", 1e-9, 1e-5),
    ("complex128", "reference_check: true", 0, 1e-12),
])
def test_reference_check_measures_the_precision_error(tmp, precision, contract_params, low, high):
    """tn.contract contracts the first bitstring again in complex128 after the pass and writes the
    relative error; it must match the error against the state vector."""
    source = "random: {rows: 3, cols: 4, cycles: 8, seed: 5}"
    spec = "name: ref\nsteps:" + circuit_steps(source, "random_bitstrings: {count: 2, seed: 1}", precision, "8KiB")
    spec = spec.replace("inputs: {network: net, plan: plan}", f"inputs: {{network: net, plan: plan}}\n    params: {{{contract_params}}}")
    spec += f"""  - id: sv128
    stage: tn.statevector
    params: {{{source}, random_bitstrings: {{count: 2, seed: 1}}, precision: complex128}}
"""
    _, run_dir = committed_run(tmp, spec)
    a, _ = amplitudes(run_dir, "amps")
    s, _ = amplitudes(run_dir, "sv128")
    with h5py.File(run_dir / "outputs" / "amps.h5") as f:
        measured = f.attrs["reference_relative_error"]
        assert f.attrs["reference_slices"] >= 1 and "reference_note" not in f.attrs
    assert low <= measured < high
    # The reference is the first bitstring in complex128: the same error the state vector sees.
    truth = abs(a[0] - s[0]) / abs(s[0])
    assert abs(measured - truth) <= 1e-9 + 1e-6 * truth, (measured, truth)


@pytest.mark.parametrize("host_budget,scratch,sliced", [("64MiB", False, False), ("256KiB", False, True),
                                                       ("256KiB", True, False)])
def test_out_of_core_spills_instead_of_slicing(tmp, host_budget, scratch, sliced):
    """With out_of_core, a budget of 1/8 of the in-core arena spills the largest intermediates to
    host memory (steps touching them run block by block) instead of slicing: the plan slices only
    what the device cannot block (as a plan with an unlimited host budget does, and fewer slices
    than in core at the same budget); a host budget too small for them all (the spilled plan needs
    384 KiB of host memory) adds slices (here tn.plan's cheapest plan within both budgets slices in
    core and spills nothing), or with scratch, they live in an HDF5 scratch file (removed
    afterwards). The amplitudes still match the state vector."""
    source = "random: {rows: 4, cols: 5, cycles: 8, seed: 3}"
    bits = "random_bitstrings: {count: 2, seed: 9}"
    spec = "name: ooc\nsteps:" + circuit_steps(source, bits, "complex128", "256KiB", path=OOC_PATH) + f"""\
  - id: plan_incore
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{precision: complex128, bandwidth: 1.0e10, gemm_rate: 1.0e11}}
  - id: incore
    stage: tn.contract
    inputs: {{network: net, plan: plan_incore}}
"""
    # (pcie_bandwidth is measured: it only changes predictions)
    spec = spec.replace("budget: 256KiB", f"budget: 256KiB, out_of_core: true, host_budget: {host_budget}, "
                                          f"scratch: {str(scratch).lower()}")
    spec += """\
  - id: plan_host_unlimited
    stage: tn.plan
    inputs: {network: net, path: path}
    params: {precision: complex128, bandwidth: 1.0e10, gemm_rate: 1.0e11, pcie_bandwidth: 1.0e10, budget: 256KiB, out_of_core: true, host_budget: 64GiB}
  - id: plan_incore_small
    stage: tn.plan
    inputs: {network: net, path: path}
    params: {precision: complex128, bandwidth: 1.0e10, gemm_rate: 1.0e11, budget: 256KiB}
"""
    (tmp / "scratch").mkdir(parents=True)
    spec = spec.replace("inputs: {network: net, plan: plan}\n",
                        f"inputs: {{network: net, plan: plan}}\n    params: {{scratch_dir: {tmp / 'scratch'}}}\n")
    _, run_dir = committed_run(tmp, spec)
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        plan = json.loads(bytes(f["plan"][()]).decode())
        prediction = json.loads(bytes(f["prediction"][()]).decode())
        # pcie_bandwidth measured: the prediction is a measurement
        assert f["prediction"].attrs["qstage.measured"] == 1 and prediction["measured"]
        assert (f.attrs["spilled"] > 0) != sliced and f.attrs["arena_bytes"] <= 256 * 1024
        slices = f.attrs["slices"]
    with h5py.File(run_dir / "outputs" / "plan_host_unlimited.h5") as f:
        device_only = f.attrs["slices"]
    with h5py.File(run_dir / "outputs" / "plan_incore_small.h5") as f:
        assert f.attrs["slices"] > device_only, "spilling should save slices at the same device budget"
    assert (slices > device_only) == sliced
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        assert f.attrs["scratch"] == scratch
        assert scratch or f.attrs["host_arena_bytes"] <= int(host_budget[:-3]) * (2**20 if host_budget.endswith("MiB") else 2**10)
    assert not list((tmp / "scratch").iterdir()), "the scratch file is removed after the step"
    assert sliced or any(st["blocks"] > 1 for st in plan["steps"]), "some step should run in blocks"
    if not sliced:
        check_block_copies(plan, network_of(run_dir), element_bytes=16)
    assert prediction["rates"]["pcie_source"] == "measured by tn.plan" and prediction["pcie_bandwidth"] > 0
    assert "pcie_bandwidth" not in plan and "rates" not in plan
    with h5py.File(run_dir / "outputs" / "plan_incore.h5") as f:
        assert f.attrs["spilled"] == 0 and f.attrs["slices"] == 1 and f.attrs["arena_bytes"] > 8 * 256 * 1024
    a, _ = amplitudes(run_dir, "amps")
    incore, _ = amplitudes(run_dir, "incore")
    s, _ = amplitudes(run_dir, "sv")
    assert relative_error(a, s) < 1e-12 and relative_error(incore, s) < 1e-12


def check_block_copies(plan, net, element_bytes):
    """Walks every spilled step's blocks in the plan's block order and counts, by brute force, the
    bytes copied when a host operand is copied in only as its own block changes: they must be the
    plan's host_bytes, and reordering must have saved copies somewhere."""
    extent = {int(k): v for k, v in net["size_dict"].items()}
    size = lambda modes: int(np.prod([extent[m] for m in modes], dtype=np.int64))
    reordered = False
    for st in plan["steps"]:
        if not any(st["host"]):
            continue
        fixed = st["c_modes"][:st["block_modes"]]
        order = st["block_order"]
        assert sorted(order) == sorted(fixed), st
        copied = size(st["c_modes"]) if st["host"][2] else 0
        for modes, on_host in ((st["a_modes"], st["host"][0]), (st["b_modes"], st["host"][1])):
            own = [m for m in order if m in modes]
            per_block = size(modes) // size(own)
            last, fetches = None, 0
            for values in np.ndindex(*[extent[m] for m in order]):
                key = tuple(v for m, v in zip(order, values) if m in own)
                fetches += key != last
                last = key
            copied += on_host * fetches * per_block
            in_c_order = 1  # copies had the blocks been walked in C's order
            for i, m in enumerate(fixed):
                if any(x in own for x in fixed[i:]):
                    in_c_order *= extent[m]
            reordered |= on_host and fetches < in_c_order
        assert st["host_bytes"] == copied * element_bytes, (st["host_bytes"], copied, st)
    assert reordered, "some step should save copies by walking its blocks in another order"


def network_of(run_dir, step="net"):
    with h5py.File(run_dir / "outputs" / f"{step}.h5") as f:
        return json.loads(bytes(f["network"][()]).decode())


def einsum_spec(name, expression, sizes, seed):
    """A workflow whose step net builds the einsum network of `expression` with random tensors."""
    return f"""
name: {name}
steps:
  - id: net
    stage: tn.build
    params: {{einsum: {{expression: "{expression}", sizes: {json.dumps(sizes)}, seed: {seed}}}}}
"""


@pytest.mark.skipif(DEVICE == "cpu" and not os.environ.get("QSTAGE_TEST_SLOW"),
                    reason="circuit_q24 amplitudes cost about 2e12 flops each (over 10 minutes on a 2-core CPU): "
                           "runs with QSTAGE_TEST_DEVICE=cuda or QSTAGE_TEST_SLOW=1")
def test_q24_with_published_bitstrings(tmp):
    """qsim's circuit_q24 (24 qubits, 1258 gates) with its published bitstrings, our own path and a
    2 GiB budget. (The path's largest intermediate is 2^24 values or less, 128 MiB, so it is not
    sliced: slicing such a state-vector-like path multiplies its flops by thousands, 4096 slices for
    half of its largest tensor; sliced plans are checked against the state vector on smaller
    circuits above.)"""
    circuit, bits = DATA / "circuit_q24.qsim", DATA / "bitstrings_q24_s1.txt"
    source = f"circuit: {circuit}"
    spec = "name: q24\nsteps:" + circuit_steps(source, f"bitstrings_file: {bits}, count: 2", "complex64", "2GiB")
    spec = spec.replace("max_seconds: 600, max_tries: 64", "max_seconds: 10, max_tries: 100000")
    # The oracle in complex128. The time-limited path search changes the summation order from run
    # to run; against a complex64 state vector the amplitudes differed by 1.07e-5 once (H100,
    # 2026-11-22): two roundings, neither of them wrong.
    spec = spec.replace("count: 2, precision: complex64}", "count: 2, precision: complex128}")
    _, run_dir = committed_run(tmp, spec)
    a, bits_a = amplitudes(run_dir, "amps")
    s, _ = amplitudes(run_dir, "sv")
    assert "".join(map(str, bits_a[0])) == bits.read_text().split()[0]
    assert relative_error(a, s) < 1e-5, (a, s)  # complex64's rounding over 1258 gates, against exact


def test_imported_cotengra_path_with_sliced_indices(tmp):
    """A sliced contraction tree from cotengra, imported as {path, sliced}: the plan keeps exactly
    cotengra's sliced indices and the amplitudes match the state vector."""
    ctg = pytest.importorskip("cotengra", reason="cotengra not installed: run scripts/setup.sh --test-oracles")
    source = "random: {rows: 4, cols: 5, cycles: 10, seed: 6}"
    bits = "random_bitstrings: {count: 2, seed: 3}"
    build = f"name: ctg\nsteps:\n  - id: net\n    stage: tn.build\n    params: {{{source}, {bits}}}\n"
    _, run_dir = committed_run(tmp, build)
    net = network_of(run_dir)
    inputs = [tuple(t) for t in net["inputs"]]
    sizes = {int(k): v for k, v in net["size_dict"].items()}
    opt = ctg.HyperOptimizer(methods=["greedy"], max_repeats=8, progbar=False, parallel=False)
    tree = opt.search(inputs, tuple(net["output"]), sizes)
    width = int(tree.contraction_width())
    tree = tree.slice(target_size=2 ** (width - 3))
    assert 3 <= len(tree.sliced_inds) <= 8
    (tmp / "ctg.json").write_text(json.dumps({"path": [list(s) for s in tree.get_path()],
                                              "sliced": [int(i) for i in tree.sliced_inds]}))
    spec = build + contract_steps("precision: complex128, budget: 1GiB", "import: ctg.json")[1:] + f"""\
  - id: sv
    stage: tn.statevector
    params: {{{source}, {bits}, precision: complex128}}
"""
    _, run_dir = committed_run(tmp, spec)
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        assert f.attrs["slices"] == 2 ** len(tree.sliced_inds)
    a, _ = amplitudes(run_dir, "amps")
    s, _ = amplitudes(run_dir, "sv")
    assert relative_error(a, s) < 1e-12, (a, s)


def test_paths_and_slicing_agree_and_norm_is_one(tmp):
    source = "random: {rows: 3, cols: 4, cycles: 8, seed: 5}"
    bits = "random_bitstrings: {count: 2, seed: 1}"
    spec = ("name: agree\nsteps:" + circuit_steps(source, bits, "complex128", "1GiB", 0, "_a")
            + circuit_steps(source, bits, "complex128", "16KiB", 7, "_b"))
    _, run_dir = committed_run(tmp, spec)
    a, _ = amplitudes(run_dir, "amps_a")
    b, _ = amplitudes(run_dir, "amps_b")
    assert relative_error(a, b) < 1e-12
    # <psi|psi> = 1: every qubit open gives the whole state.
    spec = f"""
name: norm
steps:
  - id: net
    stage: tn.build
    params: {{{source}, open: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}}""" + contract_steps(
        "precision: complex128, budget: 256KiB", result="psi")
    _, run_dir = committed_run(tmp / "norm", spec)
    psi, _ = amplitudes(run_dir, "psi")
    assert psi.size == 4096
    assert abs(np.vdot(psi, psi).real - 1) < 1e-12


@pytest.mark.parametrize("expression,sizes,packed,copies", [
    ("abc,cde,efa,bdf->", "{a: 4, b: 5, c: 6, d: 3, e: 4, f: 2}", 0, 0),
    # Batch modes a, b around x, which B lacks: too many strided calls, so the step is packed:
    # A is copied into [a b | x | k], the GEMM writes [a b | x | y], which is copied into [a x b y].
    ("axbk,abyk->axby", "{a: 16, x: 32, b: 2, k: 32, y: 512}", 1, 2),
    # No batch: C interleaves the operands' modes (x, y, z from A; u, v from B), one GEMM plus
    # the copy of its result into C's layout.
    # (With k: 32, B would be gate-sized, 4096 values, and the step would run looped.)
    ("xyzk,uvk->xuyvz", "{x: 8, u: 8, y: 8, v: 16, z: 64, k: 64}", 1, 1),
])
def test_einsum_network_matches_numpy(tmp, expression, sizes, packed, copies):
    spec = f"""
name: einsum
steps:
  - id: net
    stage: tn.build
    params: {{einsum: {{expression: "{expression}", sizes: {sizes}, seed: 3}}}}""" + \
        contract_steps("precision: complex128, budget: 64MiB", result="value")
    _, run_dir = committed_run(tmp, spec)
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        assert f.attrs["packed_steps"] == packed
        assert f.attrs["step_transposes"] == copies
    expected = network_einsum(run_dir / "outputs" / "net.h5")
    with h5py.File(run_dir / "outputs" / "value.h5") as f:
        got = f["value"][()].reshape(-1)
    assert np.linalg.norm(got - expected) <= 1e-12 * max(1, np.linalg.norm(expected))


def linear_to_ssa(path, n):
    ids, ssa, nxt = list(range(n)), [], n
    for step in path:
        ops = [ids[i] for i in step]
        for i in sorted(step, reverse=True):
            del ids[i]
        acc = ops[0]
        for o in ops[1:]:
            ssa.append([acc, o])
            acc, nxt = nxt, nxt + 1
        ids.append(acc)
    return ssa


@pytest.mark.parametrize("fmt", ["linear", "ssa"])
def test_imported_opt_einsum_path_is_followed_exactly(tmp, fmt):
    oe = pytest.importorskip("opt_einsum", reason="opt_einsum not installed: run scripts/setup.sh --test-oracles")
    # A triangular prism (two triangles joined by three legs) with an open leg: paths can differ.
    expr = "abig,bcj,cak,ide,jef,kfd,gm->m"
    sizes = {c: 2 + (ord(c) % 3) for c in "abcdefghijkm"}
    spec = einsum_spec("oe", expr, sizes, 11)
    _, run_dir = committed_run(tmp, spec)
    net = network_of(run_dir)
    letters = {}
    for modes in net["inputs"] + [net["output"]]:
        for m in modes:
            letters.setdefault(m, oe.get_symbol(len(letters)))
    sd = {int(k): v for k, v in net["size_dict"].items()}
    terms = ["".join(letters[m] for m in t) for t in net["inputs"]]
    eq = ",".join(terms) + "->" + "".join(letters[m] for m in net["output"])
    shapes = [tuple(sd[m] for m in t) for t in net["inputs"]]
    linear, _ = oe.contract_path(eq, *shapes, shapes=True, optimize="dp")
    path = [list(s) for s in linear] if fmt == "linear" else oe.paths.linear_to_ssa(linear)
    (tmp / "oe.json").write_text(json.dumps(path))
    spec += contract_steps("precision: complex128, budget: 1MiB", f"import: oe.json, format: {fmt}", result="value")[1:]
    _, run_dir = committed_run(tmp, spec)
    with h5py.File(run_dir / "outputs" / "path.h5") as f:
        stored = f["path"][()].tolist()
    assert stored == linear_to_ssa(linear, len(terms))
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        tensors = [f["tensors"][f"t{i:06d}"][()].reshape(s) for i, s in enumerate(shapes)]
    expected = np.einsum(eq, *tensors)
    with h5py.File(run_dir / "outputs" / "value.h5") as f:
        got = f[[k for k in ("amplitudes", "value") if k in f][0]][()].reshape(-1)
    assert np.allclose(got, expected.reshape(-1), rtol=1e-12, atol=0)


@pytest.mark.parametrize("precision,tol", [("complex128", 1e-12), ("complex64", 1e-5)])
def test_a_chain_of_gates_on_one_large_tensor_runs_as_one_pass_with_numpys_value(tmp, precision, tol):
    """Six 2 x 2 gates applied one after another to a 4096-value tensor (an imported path that
    applies them in turn): tn.plan folds the chain into passes over the large tensor (fused_gates),
    fewer bytes move, and the value is numpy.einsum's, as without fusion (fuse_gates: false)."""
    expr = "abcdefghijkl,ma,nm,ob,po,qc,rq->nprdefghijkl"
    sizes = {c: 2 for c in "abcdefghijklmnopqr"}
    chain = [[0, 1], [7, 2], [8, 3], [9, 4], [10, 5], [11, 6]]
    (tmp / "chain.json").parent.mkdir(parents=True, exist_ok=True)
    (tmp / "chain.json").write_text(json.dumps(chain))
    spec = einsum_spec("chain", expr, sizes, 5) + contract_steps(f"precision: {precision}, budget: 1MiB",
                                                                 "import: chain.json, format: ssa", result="value")[1:]
    spec += f"""  - id: plan_unfused
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{precision: {precision}, budget: 1MiB, bandwidth: 1.0e10, gemm_rate: 1.0e11, fuse_gates: false}}
  - id: value_unfused
    stage: tn.contract
    inputs: {{network: net, plan: plan_unfused}}
"""
    _, run_dir = committed_run(tmp, spec)
    out = run_dir / "outputs"
    plans = {}
    for name in ("plan", "plan_unfused"):
        with h5py.File(out / f"{name}.h5") as f:
            plans[name] = (int(f.attrs["fused_gates"]), json.loads(bytes(f["plan"][()]).decode()))
    moved = {k: sum(sum(st["bytes"]) for st in p["steps"]) for k, (_, p) in plans.items()}
    assert plans["plan"][0] >= 3 and plans["plan_unfused"][0] == 0, plans
    assert moved["plan"] < 0.6 * moved["plan_unfused"], moved
    expected = network_einsum(out / "net.h5")
    for step in ("value", "value_unfused"):
        with h5py.File(out / f"{step}.h5") as f:
            got = f["value"][()].reshape(-1)
        assert relative_error(got, expected) < tol, step


def test_qaoa_maxcut_energy_matches_statevector(tmp):
    """The MaxCut energy sum over edges of (1 - <Z_a Z_b>) / 2, each term a light-cone network."""
    qaoa = "qaoa: {nodes: 8, p: 2, seed: 4, gammas: [0.4, 0.7], betas: [0.6, 0.3]}"
    _, run_dir = committed_run(tmp / "g", f"name: g\nsteps:\n  - id: net\n    stage: tn.build\n    params: {{{qaoa}}}\n")
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        edges = json.loads(f.attrs["circuit"])["graph_edges"]
    assert len(edges) == 12
    steps = ""
    for k, (a, b) in enumerate(edges):
        pauli = f"pauli: 'Z{a} Z{b}'"
        steps += f"""
  - id: net{k}
    stage: tn.build
    params: {{{qaoa}, {pauli}}}""" + contract_steps("precision: complex128, budget: 1MiB", "max_seconds: 600, max_tries: 8",
                                                   k, "zz") + f"""\
  - id: sv{k}
    stage: tn.statevector
    params: {{{qaoa}, {pauli}, precision: complex128}}
"""
    _, run_dir = committed_run(tmp / "e", "name: energy\nsteps:" + steps)

    def value(step):
        with h5py.File(run_dir / "outputs" / f"{step}.h5") as f:
            return complex(np.asarray(f["value"][()]).reshape(-1)[0])

    tn = [value(f"zz{k}") for k in range(len(edges))]
    sv = [value(f"sv{k}") for k in range(len(edges))]
    assert max(abs(z.imag) for z in tn) < 1e-12
    assert np.allclose(tn, sv, rtol=0, atol=1e-12)
    energy = sum((1 - z.real) / 2 for z in tn)
    assert abs(energy - sum((1 - z.real) / 2 for z in sv)) < 1e-11
    assert 0 < energy < len(edges)


def test_bad_circuit_line_is_named(tmp):
    bad = tmp / "bad.qsim"
    bad.write_text("2\n0 h 0\n1 cz 0 5\n")
    spec = write_spec(tmp / "spec.yaml", "name: bad\nsteps:\n  - id: net\n    stage: tn.build\n    params: {circuit: bad.qsim}\n")
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 2, r
    assert "bad.qsim:3" in r.err and "qubit 5" in r.err, r


@pytest.mark.parametrize("name,text,expected", [
    ("bad.qasm", "OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[2];\nh q[0]\ncx q[0],q[1];\n", "bad.qasm:5"),
    ("gate.qasm", "OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[2];\nfoo q[0];\n", "unknown gate 'foo'"),
    ("range.qasm", "OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[2];\nh q[2];\n", "range.qasm:4"),
    ("gate.qsim", "2\n0 h 0\n1 hadamard 1\n", "gate.qsim:3"),
    ("short.qsim", "2\n0 cz 0\n", "short.qsim:2"),
])
def test_bad_circuits_fail_with_the_line(tmp, name, text, expected):
    (tmp / name).write_text(text)
    spec = write_spec(tmp / "spec.yaml", f"name: bad\nsteps:\n  - id: net\n    stage: tn.build\n    params: {{circuit: {name}}}\n")
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 2, r
    assert expected in r.err, r
    assert not (tmp / "run" / "outputs" / "net.h5").exists()


@pytest.mark.parametrize("angle,value", [("0/0", "nan"), ("pi/0", "inf"), ("ln(0)", "-inf")])
def test_an_angle_that_is_not_a_number_is_bad_input(tmp, angle, value):
    """NaN or inf angles made every amplitude NaN, with exit 0."""
    (tmp / "c.qasm").write_text(f"OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[2];\nh q[0];\nrz({angle}) q[1];\n")
    spec = write_spec(tmp / "spec.yaml", "name: bad\nsteps:\n  - id: net\n    stage: tn.build\n    params: {circuit: c.qasm}\n")
    one_line_error(run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE]),
                   f"c.qasm:5: angle '{angle}' evaluates to {value}; expected a finite angle")
    assert not (tmp / "run" / "outputs" / "net.h5").exists()


TINY = """
name: tiny
steps:
  - id: net
    stage: tn.build
    params: {random: {rows: 2, cols: 3, cycles: 4, seed: 1}}
"""


def test_path_that_does_not_match_the_network(tmp):
    (tmp / "p.json").write_text(json.dumps([[0, 1], [0, 1]]))
    spec = TINY + "  - id: path\n    stage: tn.path\n    inputs: {network: net}\n    params: {import: p.json}\n"
    spec = write_spec(tmp / "spec.yaml", spec)
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 2, r
    assert "does not match the network" in r.err and "p.json" in r.err, r
    assert (tmp / "run" / "outputs" / "net.h5").exists(), "the finished step's output must survive"


@pytest.mark.parametrize("circuit,params,expected", [
    ("rows: 2, cols: 3, cycles: 4", "budget: 64B", "too small even with slicing"),
    ("rows: 3, cols: 4, cycles: 8", "budget: 8KiB, max_slices: 2", "slices (more than 2)"),
])
def test_budget_too_small_even_with_slicing(tmp, circuit, params, expected):
    spec = TINY.replace("rows: 2, cols: 3, cycles: 4", circuit) + contract_steps(params)[1:]
    spec = write_spec(tmp / "spec.yaml", spec)
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 2, r
    assert expected in r.err, r


def test_compare_fails_with_exit_3_past_its_tolerance_and_keeps_earlier_steps(tmp):
    """tensor.compare: a complex64 contraction checked against a complex128 state vector passes at
    1e-5 and fails (exit 3) at 1e-12; a reference of another shape is bad input (exit 2)."""
    source, bits = "random: {rows: 3, cols: 3, cycles: 6, seed: 2}", "random_bitstrings: {count: 3, seed: 4}"
    base = "name: cmp\nsteps:" + circuit_steps(source, bits, "complex64", "1MiB").replace(
        "precision: complex64}}", "precision: complex128}}")
    check = "  - id: check\n    stage: tensor.compare\n    inputs: {{a: amps, b: {ref}}}\n    params: {{rtol: {rtol}}}\n"
    _, run_dir = committed_run(tmp / "ok", base + check.format(ref="sv", rtol="1.0e-5"))
    with h5py.File(run_dir / "outputs" / "check.h5") as f:
        a, s = amplitudes(run_dir, "amps")[0], amplitudes(run_dir, "sv")[0]
        assert f["relative_error"][()] == pytest.approx(relative_error(a, s), rel=1e-9)
        assert 0 < f["relative_error"][()] < 1e-5
    spec = write_spec(tmp / "strict.yaml", base + check.format(ref="sv", rtol="1.0e-12"))
    r = run(["run", spec, "--run-dir", tmp / "strict", "--device", DEVICE])
    assert r.code == 3, r
    assert "check failed" in r.err and "exceeds rtol 1.000e-12" in r.err, r
    assert (tmp / "strict" / "outputs" / "amps.h5").exists() and not (tmp / "strict" / "outputs" / "check.h5").exists()
    other = base + "  - id: other\n    stage: tn.statevector\n    params: {random: {rows: 3, cols: 3, cycles: 6, seed: 2}, random_bitstrings: {count: 2, seed: 4}}\n"
    spec = write_spec(tmp / "shape.yaml", other + check.format(ref="other", rtol="1.0e-5"))
    r = run(["run", spec, "--run-dir", tmp / "shape", "--device", DEVICE])
    assert r.code == 2 and "expected the same shape" in r.err, r


def generic_network_files(tmp, rng):
    """A small network in cotengra's JSON layout and tensor data in four dtypes."""
    inputs, output = [[0, 1, 2], [2, 3], [3, 4, 0], [4, 5]], [1, 5]
    sizes = {0: 3, 1: 4, 2: 5, 3: 2, 4: 6, 5: 3}
    (tmp / "net.json").write_text(json.dumps({"inputs": inputs, "output": output,
                                              "size_dict": {str(k): v for k, v in sizes.items()}}))
    dtypes = [np.complex128, np.complex64, np.float64, np.float32]
    tensors = []
    for modes, dt in zip(inputs, dtypes):
        shape = [sizes[m] for m in modes]
        t = rng.standard_normal(shape)
        if np.iscomplexobj(np.zeros(1, dt)):
            t = t + 1j * rng.standard_normal(shape)
        tensors.append(t.astype(dt))
    expected = np.einsum("abc,cd,dea,ef->bf", *[t.astype(np.complex128) for t in tensors]).reshape(-1)
    return tensors, expected


@pytest.mark.parametrize("layout", ["hdf5", "npy"])
def test_generic_network_with_tensor_data(tmp, layout):
    """Tensor data from an HDF5 file (/t0, /t1, ...) or a folder of .npy files (numpy.save), in
    float32/64 and complex64/128: the contraction matches numpy.einsum."""
    tmp.mkdir(parents=True, exist_ok=True)
    tensors, expected = generic_network_files(tmp, np.random.default_rng(5))
    if layout == "hdf5":
        with h5py.File(tmp / "data.h5", "w") as f:
            for i, t in enumerate(tensors):
                f[f"t{i}"] = t
        data = "data.h5"
    else:
        (tmp / "data").mkdir()
        for i, t in enumerate(tensors):
            np.save(tmp / "data" / f"t{i}.npy", t)
        data = "data"
    spec = f"""name: generic
steps:
  - id: net
    stage: tn.build
    params: {{network: net.json, tensors: {data}}}""" + contract_steps("precision: complex128", result="value")
    _, run_dir = committed_run(tmp, spec)
    with h5py.File(run_dir / "outputs" / "value.h5") as f:
        got = f["value"][()].reshape(-1)
    assert np.linalg.norm(got - expected) <= 1e-12 * np.linalg.norm(expected)


@pytest.mark.parametrize("bad,message", [
    (lambda t: np.asfortranarray(t[0]), "Fortran order"),
    (lambda t: np.arange(60, dtype=np.int64).reshape(3, 4, 5), "expected little-endian float32"),
    (lambda t: t[0][:2], "has 40 values; expected 60"),
    (None, "not a .npy file"),
])
def test_bad_npy_tensor_data(tmp, bad, message):
    tmp.mkdir(parents=True, exist_ok=True)
    tensors, _ = generic_network_files(tmp, np.random.default_rng(5))
    (tmp / "data").mkdir()
    for i, t in enumerate(tensors):
        np.save(tmp / "data" / f"t{i}.npy", t)
    if bad is None:
        (tmp / "data" / "t0.npy").write_bytes(b"not numpy at all")
    else:
        np.save(tmp / "data" / "t0.npy", bad(tensors))
    spec = write_spec(tmp / "spec.yaml", """name: bad
steps:
  - id: net
    stage: tn.build
    params: {network: net.json, tensors: data}
""")
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 2 and message in r.err and "t0.npy" in r.err, r


def test_inspect_plots_a_plan(tmp):
    """`qstage inspect plan.h5 --plot`: a PNG whose tallest bar is the step with the largest
    intermediate (x = 110 + (step + 0.5) * 820 / steps, in stages/tn/views.cpp's geometry)."""
    spec = "name: plot\nsteps:" + circuit_steps("random: {rows: 3, cols: 4, cycles: 8, seed: 1}",
                                                "random_bitstrings: {count: 1, seed: 9}", "complex64", "8KiB")
    _, run_dir = committed_run(tmp, spec)
    png = tmp / "plan.png"
    r = run(["inspect", run_dir / "outputs" / "plan.h5", "--plot", png])
    assert r.code == 0, r
    img = read_png_rgb(png)
    assert img.shape == (540, 960, 3)
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        sizes = f["steps/output_bytes"][()]
    bars = np.all(img == [31, 119, 180], axis=2)  # the bars' colour
    bars[:60] = False  # (the legend, above the plot area)
    tops = np.where(bars.any(axis=0), bars.argmax(axis=0), 10**6)
    tallest = int(np.argmin(tops))
    step = int((tallest - 110) * len(sizes) / 820)
    assert sizes.max() in sizes[max(step - 1, 0):step + 2], (step, sizes)  # (a pixel of rounding either way)
    # Not a plan, and a path that cannot be written: exit 2, nothing left behind.
    r = run(["inspect", run_dir / "outputs" / "net.h5", "--plot", tmp / "net.png"])
    assert r.code == 2 and "tn.plan output" in r.err and "is not a" in r.err and not (tmp / "net.png").exists(), r
    r = run(["inspect", run_dir / "outputs" / "plan.h5", "--plot", tmp / "missing" / "plan.png"])
    assert r.code == 2 and "cannot write" in r.err, r


def test_unwritable_scratch_dir_is_a_clear_error(tmp):
    source = "random: {rows: 4, cols: 5, cycles: 8, seed: 3}"
    spec = "name: scratch\nsteps:" + circuit_steps(source, "random_bitstrings: {count: 1, seed: 9}", "complex128", "256KiB",
                                                    path=OOC_PATH)
    spec = spec.replace("budget: 256KiB", "budget: 256KiB, out_of_core: true, host_budget: 256KiB, scratch: true")
    spec = spec.replace("inputs: {network: net, plan: plan}\n",
                        f"inputs: {{network: net, plan: plan}}\n    params: {{scratch_dir: {tmp / 'no-such-dir'}}}\n")
    tmp.mkdir(parents=True, exist_ok=True)
    r = run(["run", write_spec(tmp / "spec.yaml", spec), "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 2 and "cannot create the scratch file" in r.err and "scratch_dir" in r.err, r
    assert (tmp / "run" / "outputs" / "plan.h5").exists(), "the steps before are kept"


@pytest.mark.parametrize("pipeline,bound", [("szx", 0.0), ("quantized", 1e-3), ("integrated", 1e-2)])
def test_compressed_spill_changes_the_result_only_as_far_as_its_bounds(tmp, pipeline, bound):
    """compress_spilled keeps the spilled intermediates as codec streams in host memory (the
    plan's host arena is not allocated). Lossless (error 0) gives the state vector's amplitudes;
    lossy bounds move them a little, and the reference check (on by default) measures how much
    against an uncompressed complex128 contraction."""
    source = "random: {rows: 4, cols: 5, cycles: 8, seed: 3}"
    spec = "name: cspill\nsteps:" + circuit_steps(source, "random_bitstrings: {count: 2, seed: 9}", "complex64", "256KiB",
                                                   path=OOC_PATH)
    spec = spec.replace("budget: 256KiB", "budget: 256KiB, out_of_core: true, host_budget: 64MiB")
    spec = spec.replace("inputs: {network: net, plan: plan}\n", "inputs: {network: net, plan: plan}\n    params: "
                        f"{{compress_spilled: {{pipeline: {pipeline}, error: {bound}, threshold: {bound}}}}}\n")
    _, run_dir = committed_run(tmp, spec)
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        host_arena = int(f.attrs["host_arena_bytes"])
        assert f.attrs["spilled"] > 0 and host_arena > 0
    a, _ = amplitudes(run_dir, "amps")
    s, _ = amplitudes(run_dir, "sv")
    with h5py.File(run_dir / "outputs" / "amps.h5") as f:
        raw, stored = int(f.attrs["spilled_raw_bytes"]), int(f.attrs["spilled_stored_bytes"])
        assert raw > 0 and stored > 0 and f.attrs["spilled_ratio"] == pytest.approx(raw / stored)
        assert json.loads(f.attrs["compress_spilled"])["pipeline"] == pipeline
        measured = f.attrs["reference_relative_error"]
        # Streams instead of the pinned arena: the step's peak host memory stays below the arena.
        assert f.attrs["qstage.peak_host_bytes"] < host_arena + stored
    err = relative_error(a, s)
    assert measured == pytest.approx(abs(a[0] - s[0]) / abs(s[0]), rel=1e-3, abs=1e-6)  # the first amplitude
    if bound == 0:
        assert err < 1e-5
    else:
        assert 1e-7 < err < 100 * bound, err
        assert stored < raw


def test_compressed_spill_of_a_complex128_plan_is_refused(tmp):
    source = "random: {rows: 3, cols: 4, cycles: 8, seed: 1}"
    spec = "name: cspill128\nsteps:" + circuit_steps(source, "random_bitstrings: {count: 1, seed: 9}", "complex128", "8KiB")
    spec = spec.replace("inputs: {network: net, plan: plan}\n",
                        "inputs: {network: net, plan: plan}\n    params: {compress_spilled: {pipeline: szx}}\n")
    r = run(["run", write_spec(tmp / "spec.yaml", spec), "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 2, r
    assert "parameter 'compress_spilled': compress_spilled needs a complex64 plan" in r.err, r


def reuse_spec(source, bits, budget):
    """tn.build, tn.path, and for both settings of reuse_invariant a tn.plan at `budget` (complex128,
    fixed rates) and its tn.contract."""
    spec = f"""name: reuse
steps:
  - id: net
    stage: tn.build
    params: {{{source}, {bits}}}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{max_seconds: 600, max_tries: 64}}
"""
    for suffix, reuse in (("", "true"), ("_plain", "false")):
        spec += f"""  - id: plan{suffix}
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{precision: complex128, budget: {budget}, reuse_invariant: {reuse}, bandwidth: 1.0e10, gemm_rate: 1.0e11}}
  - id: amps{suffix}
    stage: tn.contract
    inputs: {{network: net, plan: plan{suffix}}}
"""
    return spec


def plan_of(run_dir, step="plan"):
    with h5py.File(run_dir / "outputs" / f"{step}.h5") as f:
        return json.loads(bytes(f["plan"][()]).decode()), dict(f.attrs)


REUSE_SOURCE = "random: {rows: 4, cols: 4, cycles: 10, seed: 2}"
REUSE_BITS = "random_bitstrings: {count: 3, seed: 9}"


def test_invariant_steps_run_once_per_bitstring_with_bitwise_the_same_amplitudes(tmp):
    """A small budget slices the network; with reuse_invariant (the default), the steps whose result
    is the same in every slice run once per bitstring: fewer flops, the same sliced modes and the
    same amplitudes to the bit as reuse_invariant: false, and those of the state vector."""
    spec = reuse_spec(REUSE_SOURCE, REUSE_BITS, "128KiB") + f"""\
  - id: sv
    stage: tn.statevector
    params: {{{REUSE_SOURCE}, {REUSE_BITS}, precision: complex128}}
"""
    _, run_dir = committed_run(tmp, spec)
    plain, plain_attrs = plan_of(run_dir, "plan_plain")
    reused, attrs = plan_of(run_dir)
    assert plain_attrs["slices"] > 1 and len(plain["sliced"]) >= 2
    assert plain_attrs["invariant_steps"] == 0 and plain_attrs["persistent_bytes"] == 0
    assert plain_attrs["flops_total"] == plain_attrs["flops_total_without_reuse"]
    # At the budget: the arena and the persistent region fit, and fewer flops run.
    assert attrs["slices"] > 1 and attrs["invariant_steps"] > 0 and attrs["persistent_bytes"] > 0
    assert attrs["arena_bytes"] + attrs["persistent_bytes"] <= 128 * 1024
    assert attrs["prologue_arena_bytes"] <= attrs["arena_bytes"]
    assert attrs["flops_total"] == pytest.approx(attrs["invariant_flops"] + attrs["slices"] * attrs["flops_per_slice"])
    assert attrs["flops_total"] < attrs["flops_total_without_reuse"]
    assert attrs["predicted_seconds_total"] == pytest.approx(
        attrs["predicted_prologue_seconds"] + attrs["slices"] * attrs["predicted_seconds_per_slice"])
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        assert f["steps/invariant"][()].sum() == attrs["invariant_steps"]
    assert sum(st["invariant"] for st in reused["steps"]) == attrs["invariant_steps"]
    a, _ = amplitudes(run_dir, "amps")
    s, _ = amplitudes(run_dir, "sv")
    assert relative_error(a, s) < 1e-12
    with h5py.File(run_dir / "outputs" / "amps.h5") as f:
        assert f.attrs["invariant_steps"] == attrs["invariant_steps"]
        assert 1 <= f.attrs["prologue_runs"] <= 3  # once per bitstring at most
    with h5py.File(run_dir / "outputs" / "amps_plain.h5") as f:
        assert f.attrs["invariant_steps"] == 0 and f.attrs["prologue_runs"] == 0

    # Reuse changes no slicing, and no bit of the amplitudes.
    assert reused["sliced"] == plain["sliced"]
    b, _ = amplitudes(run_dir, "amps_plain")
    assert a.tobytes() == b.tobytes()


def test_invariant_steps_of_a_generic_network_run_once(tmp):
    """A generic network (no bitstrings), a chain contracted from its g end and sliced over b (an
    imported cotengra path): the three steps before b's run once, in one prologue; the value of
    numpy.einsum, and bit for bit the value without reuse."""
    expression, sizes = "ab,bc,cd,de,ef,fg->ag", "{a: 8, b: 16, c: 32, d: 32, e: 32, f: 16, g: 8}"
    tmp.mkdir(parents=True, exist_ok=True)
    imported = tmp / "path.json"
    imported.write_text(json.dumps({"path": [[4, 5], [3, 6], [2, 7], [1, 8], [0, 9]], "sliced": ["b"]}))
    spec = f"""
name: generic_reuse
steps:
  - id: net
    stage: tn.build
    params: {{einsum: {{expression: "{expression}", sizes: {sizes}, seed: 3}}}}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{import: {imported}, format: ssa}}
"""
    for suffix, reuse in (("", "true"), ("_plain", "false")):
        spec += f"""  - id: plan{suffix}
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{precision: complex128, reuse_invariant: {reuse}, bandwidth: 1.0e10, gemm_rate: 1.0e11}}
  - id: value{suffix}
    stage: tn.contract
    inputs: {{network: net, plan: plan{suffix}}}
"""
    _, run_dir = committed_run(tmp, spec)
    reused, attrs = plan_of(run_dir)
    plain, plain_attrs = plan_of(run_dir, "plan_plain")
    assert plain_attrs["slices"] == 16 and reused["sliced"] == plain["sliced"]
    assert attrs["invariant_steps"] == 3 and attrs["flops_total"] < attrs["flops_total_without_reuse"]
    values = {}
    for suffix in ("", "_plain"):
        with h5py.File(run_dir / "outputs" / f"value{suffix}.h5") as f:
            values[suffix] = f["value"][()]
            runs = f.attrs["prologue_runs"]
        assert runs == (1 if suffix == "" else 0)
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        net = json.loads(bytes(f["network"][()]).decode())
        tensors = [f["tensors"][f"t{i:06d}"][()] for i in range(len(net["inputs"]))]
    extents = {int(k): v for k, v in net["size_dict"].items()}
    letters = "abcdefghijklmnop"
    shaped = [t.reshape([extents[m] for m in modes]) for t, modes in zip(tensors, net["inputs"])]
    expr = ",".join("".join(letters[m] for m in modes) for modes in net["inputs"]) + "->" + \
        "".join(letters[m] for m in net["output"])
    expected = np.einsum(expr, *shaped).reshape(-1)
    assert np.linalg.norm(values[""].reshape(-1) - expected) <= 1e-12 * np.linalg.norm(expected)
    assert values[""].tobytes() == values["_plain"].tobytes()


def test_the_rates_are_measured_within_a_small_device_budget_or_refused_in_one_line(tmp):
    """tn.plan's measurement takes one buffer of what the budget leaves (a GPU run under
    --device-memory 40MiB once failed with exit 1: its second buffer was charged beside the
    first, which the device pool kept); with too little left it exits 2 naming the parameters
    that skip it."""
    spec = write_spec(tmp / "spec.yaml", """
name: small
steps:
  - id: net
    stage: tn.build
    params: {random: {rows: 2, cols: 3, cycles: 4, seed: 1}, random_bitstrings: {count: 1, seed: 2}}
  - id: path
    stage: tn.path
    inputs: {network: net}
    params: {max_tries: 4}
  - id: plan
    stage: tn.plan
    inputs: {network: net, path: path}
    params: {precision: complex64, budget: 8KiB}
""")
    for memory in ["40MiB", "24MiB"]:
        r = run(["run", spec, "--run-dir", tmp / memory, "--device", DEVICE, "--device-memory", memory])
        assert r.code == 0, (memory, r)
    one_line_error(run(["run", spec, "--run-dir", tmp / "tiny", "--device", DEVICE, "--device-memory", "4KiB"]),
                   "too little to measure", "bandwidth")


def test_measured_rates_are_kept_apart_from_the_plan_and_still_verified(tmp):
    """Without bandwidth and gemm_rate, tn.plan measures them on the device: the rates and the
    seconds predicted from them go to the dataset `prediction` and the column
    steps/predicted_seconds, both marked as measurements (qstage.measured), and the schedule in
    `plan` holds none of them. The step's record lists them apart from its content; their
    checksums are still recorded, and `inspect --verify` checks them. Rates given as parameters
    are inputs: that prediction is no measurement."""
    spec = """
name: measured
steps:
  - id: net
    stage: tn.build
    params: {random: {rows: 3, cols: 4, cycles: 8, seed: 1}, random_bitstrings: {count: 2, seed: 2}}
  - id: path
    stage: tn.path
    inputs: {network: net}
    params: {max_seconds: 600, max_tries: 16}
  - id: plan
    stage: tn.plan
    inputs: {network: net, path: path}
    params: {precision: complex64, budget: 8KiB}
  - id: given
    stage: tn.plan
    inputs: {network: net, path: path}
    params: {precision: complex64, budget: 8KiB, bandwidth: 1.0e10, gemm_rate: 1.0e11}
  - id: amps
    stage: tn.contract
    inputs: {network: net, plan: plan}
"""
    _, run_dir = committed_run(tmp, spec)
    out = run_dir / "outputs"
    with h5py.File(out / "plan.h5") as f:
        plan = json.loads(bytes(f["plan"][()]).decode())
        prediction = json.loads(bytes(f["prediction"][()]).decode())
        for name in ("prediction", "steps/predicted_seconds"):
            assert f[name].attrs["qstage.measured"] == 1 and "qsum64" in f[name].attrs, name
        assert "qstage.measured" not in f["plan"].attrs and "qstage.measured" not in f["steps/flops"].attrs
        predicted = f["steps/predicted_seconds"][()]
    assert prediction["measured"] and prediction["rates"]["source"].startswith("measured by tn.plan")
    assert prediction["bandwidth"] > 0 and prediction["gemm_rate"] > 0 and prediction["predicted_seconds_total"] > 0
    assert len(prediction["steps"]) == len(plan["steps"]) == len(predicted)
    assert [st["predicted_seconds"] for st in prediction["steps"]] == list(predicted)
    for rate in ("bandwidth", "gemm_rate", "pcie_bandwidth", "rates", "predicted_seconds_per_slice",
                 "predicted_prologue_seconds"):
        assert rate not in plan, rate
    assert all("predicted_seconds" not in st for st in plan["steps"])
    records = manifest(run_dir)["steps"]
    assert records["plan"]["measured"] == ["prediction", "steps/predicted_seconds"]
    assert records["amps"]["measured"] == ["step_of_roofline", "step_roofline_seconds", "step_seconds"]
    assert "prediction" in records["plan"]["checksums"] and "step_seconds" in records["amps"]["checksums"]
    with h5py.File(out / "given.h5") as f:
        assert "qstage.measured" not in f["prediction"].attrs and "qstage.measured" not in f["steps/predicted_seconds"].attrs
        given = json.loads(bytes(f["prediction"][()]).decode())
    assert not given["measured"] and given["rates"]["source"] == "params" and given["gemm_rate"] == 1.0e11
    assert "measured" not in records["given"]
    for step in ("plan", "amps"):
        r = run(["inspect", out / f"{step}.h5", "--verify"])
        assert r.code == 0 and "every checksum matches the data" in r.out, r
    with h5py.File(out / "plan.h5", "r+") as f:  # a measurement changed behind qstage's back
        f["steps/predicted_seconds"][0] = 2 * predicted[0] + 1
    r = run(["inspect", out / "plan.h5", "--verify", "--json"])
    assert r.code == 3, r
    bad = [d["dataset"] for d in json.loads(r.out)["datasets"] if d["status"] != "ok"]
    assert bad == ["/steps/predicted_seconds"], bad


def timed_and_quiet_spec(name, bitstrings):
    """A random circuit's amplitudes contracted twice from one plan: `amps` (its first item timed
    step by step) and `quiet` (time_steps: false)."""
    return f"""
name: {name}
steps:
  - id: net
    stage: tn.build
    params: {{random: {{rows: 3, cols: 4, cycles: 8, seed: 1}}, random_bitstrings: {{count: {bitstrings}, seed: 2}}}}""" + \
        contract_steps("precision: complex64, budget: 8KiB") + """\
  - id: quiet
    stage: tn.contract
    inputs: {network: net, plan: plan}
    params: {time_steps: false}
"""


def test_step_timing_off_leaves_the_amplitudes_and_writes_nan(tmp):
    """tn.contract times its first work item step by step (step_seconds, one per plan step);
    time_steps: false times none (NaN) and gives the same amplitudes, bit for bit."""
    _, run_dir = committed_run(tmp, timed_and_quiet_spec("timing", 3))
    timed, _ = amplitudes(run_dir, "amps")
    quiet, _ = amplitudes(run_dir, "quiet")
    assert np.array_equal(timed, quiet)
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        steps = len(json.loads(bytes(f["plan"][()]).decode())["steps"])
    with h5py.File(run_dir / "outputs" / "amps.h5") as f:
        seconds = f["step_seconds"][()]
        assert f["step_seconds"].attrs["qstage.measured"] == 1  # (out of the step's content identity)
    assert seconds.shape == (steps,) and np.all(np.isfinite(seconds)) and np.all(seconds >= 0)
    with h5py.File(run_dir / "outputs" / "quiet.h5") as f:
        assert f["step_seconds"].shape == (steps,) and np.all(np.isnan(f["step_seconds"][()]))
    # The manifest splits each step's time: before the engine (inputs read, the pass planned), its
    # setup, its loop and its finalize, which together fit in the step's seconds.
    for name in ("amps", "quiet"):
        m = manifest(run_dir)["steps"][name]["metrics"]
        parts = [m[k] for k in ("prepare_seconds", "setup_seconds", "loop_seconds", "finalize_seconds")]
        assert all(p >= 0 for p in parts) and m["prepare_seconds"] > 0, m
        assert sum(parts) <= m["seconds"] * (1 + 1e-6) + 1e-5, m


def test_the_step_profile_sets_each_step_beside_its_roofline(tmp):
    """tn.contract writes each plan step's bytes and flops, its roofline at the rates the plan was
    made with (bytes at the bandwidth or flops at the GEMM rate, whichever is longer), and the
    fraction of it the timed item reached; untimed steps get NaN."""
    _, run_dir = committed_run(tmp, timed_and_quiet_spec("roofline", 2))
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        steps = json.loads(bytes(f["plan"][()]).decode())["steps"]
        prediction = json.loads(bytes(f["prediction"][()]).decode())
    moved = np.array([sum(st["bytes"]) + 2 * st["transposed_bytes"] for st in steps], dtype=np.uint64)
    flops = np.array([st["flops"] for st in steps])
    want = np.maximum(moved / prediction["bandwidth"], flops / prediction["gemm_rate"])
    with h5py.File(run_dir / "outputs" / "amps.h5") as f:
        assert np.array_equal(f["step_bytes"][()], moved) and np.array_equal(f["step_flops"][()], flops)
        roofline = f["step_roofline_seconds"][()]
        np.testing.assert_allclose(roofline, want, rtol=1e-12)
        assert f["step_roofline_seconds"].attrs["bandwidth"] == prediction["bandwidth"]
        np.testing.assert_allclose(f["step_of_roofline"][()], roofline / f["step_seconds"][()], rtol=1e-12)
        assert np.all(f["step_of_roofline"][()] > 0)
        assert f["step_of_roofline"].attrs["qstage.measured"] == 1 and "qstage.measured" not in f["step_bytes"].attrs
    with h5py.File(run_dir / "outputs" / "quiet.h5") as f:
        assert np.all(np.isnan(f["step_of_roofline"][()])) and np.array_equal(f["step_bytes"][()], moved)


def test_a_plan_for_several_ranks_distributes_its_large_steps_and_predicts_the_gain(tmp):
    """tn.plan with ranks: P (seed 000 section IV-B, a what-if that needs no GPUs): the contraction
    sliced against P budgets, its large steps' transitions along use-chains (activate first, then
    keep or redistribute, the chain's result gathered after its last step), distributed modes whose
    extents reach P, and R_P, S_P, E_P against the one-rank plan. ranks: 1 adds nothing."""
    source = "random: {rows: 4, cols: 5, cycles: 10, seed: 3}"
    bits = "random_bitstrings: {count: 1, seed: 1}"
    steps = circuit_steps(source, bits, "complex64", "64KiB")
    # (without gate fusion: a fused pass trades flops for bytes, and the P-rank plan's larger
    # tensors may fuse where the one-rank plan's do not, so R_P, a ratio of flops, could fall below 1)
    spec = "name: dist\nsteps:" + steps.replace("budget: 64KiB",
                                                 "budget: 64KiB, ranks: 8, large_bytes: 8KiB, fuse_gates: false")
    _, run_dir = committed_run(tmp / "eight", spec)
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        plan = json.loads(bytes(f["plan"][()]).decode())
        projected = json.loads(bytes(f["prediction"][()]).decode())["distribution"]
        attrs = dict(f.attrs)
    d = plan["distribution"]
    assert d["ranks"] == 8 and attrs["distribution_ranks"] == 8
    assert d["slices"] <= plan["slices"] and d["R_P"] >= 1 and attrs["distribution_R_P"] == d["R_P"]
    assert abs(projected["E_P"] - projected["S_P"] / 8) < 1e-12 * projected["S_P"]
    assert attrs["distribution_S_P"] == projected["S_P"] and "S_P" not in d
    assert d["chains"], "a 64 KiB budget with 8 KiB large steps has use-chains"
    # (every mode of a qubit circuit has extent 2: the distributed modes' extents multiply to 2^len)
    chained = {s for chain in d["chains"] for s in chain}
    for chain in d["chains"]:
        kinds = [d["steps"][s]["transition"] for s in chain]
        assert kinds[0] == "activate", kinds  # (a chain of one step: activated, then gathered)
        assert all(k in ("keep", "redistribute") for k in kinds[1:-1]), kinds
        assert len(chain) == 1 or kinds[-1] in ("gather", "redistribute"), kinds
        for s in chain:
            assert 2 ** len(d["steps"][s]["distributed_modes"]) >= 8
            assert projected["steps"][s]["comm_seconds"] >= 0
        assert d["steps"][chain[-1]]["moved_bytes"] > 0  # the gather
    for i, s in enumerate(d["steps"]):
        assert (s["transition"] == "local") == (i not in chained)
        assert s["forced"] is False or s["transition"] == "redistribute"
    assert sum(s["moved_bytes"] for s in d["steps"]) == d["moved_bytes"]
    # one rank: the same plan without a distribution
    _, one = committed_run(tmp / "one", "name: dist\nsteps:" + steps)
    with h5py.File(one / "outputs" / "plan.h5") as f:
        single = json.loads(bytes(f["plan"][()]).decode())
        assert "distribution" not in single and "distribution_ranks" not in f.attrs
    assert single["slices"] == plan["slices"]
    # a rank count below one is refused before anything runs
    bad = write_spec(tmp / "bad.yaml", "name: dist\nsteps:" + steps.replace("budget: 64KiB", "budget: 64KiB, ranks: 0"))
    r = run(["run", bad, "--run-dir", tmp / "bad", "--device", DEVICE])
    assert r.code == 2 and "ranks" in r.err, r
