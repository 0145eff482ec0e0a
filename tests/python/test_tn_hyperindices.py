"""Hyperindices: a mode held by three tensors or more is summed once over all of them (what a
copy tensor joining them would do), and kept while any holder is left. tn.build accepts such
networks (einsum expressions with a letter in several operands, cotengra JSON), tn.path searches
them, tn.plan slices them and tn.contract contracts them. The oracle is numpy.einsum, which reads
a repeated label the same way. Sliced plans and two ranks give the one-rank bytes."""
import json

import h5py
import numpy as np
import pytest

from conftest import DEVICE, committed_run, one_line_error, run, write_spec
from test_tn_distributed import distributed_run, spec_text


def contract_spec(source, budget="64MiB"):
    """tn.build (source), tn.path, tn.plan in complex128 at `budget`, tn.contract into step value."""
    return spec_text(source, "complex128", 1, budget=budget)


def einsum_of_network(run_dir):
    """The network tn.build wrote, contracted by variable elimination written here: each closed mode
    in turn (the one whose elimination makes the smallest tensor first), numpy.einsum over the
    tensors holding it, that mode summed. numpy.einsum reads a label in several operands as a
    hyperindex; its own path search is far too slow on networks of this kind."""
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        net = json.loads(bytes(f["network"][()]).decode())
        data = [f["tensors"][n][()] for n in sorted(f["tensors"])]
    extents = {int(k): v for k, v in net["size_dict"].items()}
    output = list(net["output"])
    tensors = [(list(modes), t.reshape([extents[m] for m in modes])) for t, modes in zip(data, net["inputs"])]

    def joined_modes(group, summed):
        modes = []
        for ms, _ in group:
            modes += [m for m in ms if m not in modes and m != summed]
        return modes

    def product(group, keep):
        labels = {m: i for i, m in enumerate(sorted({m for ms, _ in group for m in ms}))}
        operands = []
        for ms, t in group:
            operands += [t, [labels[m] for m in ms]]
        return keep, np.einsum(*operands, [labels[m] for m in keep])

    closed = sorted({m for ms, _ in tensors for m in ms} - set(output))
    while closed:
        def size(m):
            group = [x for x in tensors if m in x[0]]
            return (int(np.prod([extents[k] for k in joined_modes(group, m)])), m)
        m = min(closed, key=size)
        closed.remove(m)
        group = [x for x in tensors if m in x[0]]
        tensors = [x for x in tensors if m not in x[0]] + [product(group, joined_modes(group, m))]
    _, result = product(tensors, output)
    return np.asarray(result).reshape(-1), net


def value_of(run_dir):
    with h5py.File(run_dir / "outputs" / "value.h5") as f:
        return f["value"][()].reshape(-1), dict(f.attrs)


def hypergraph_file(tmp, tensors=24, hyper=20, seed=1):
    """A ring of bonds (connected) plus `hyper` modes each joining 3-5 distinct tensors, extents 2
    and 3, one open bond and one open hyperindex."""
    rng = np.random.default_rng(seed)
    inputs = [[] for _ in range(tensors)]
    sizes = {}
    label = 0
    for t in range(tensors):
        inputs[t].append(label), inputs[(t + 1) % tensors].append(label)
        sizes[label], label = int(rng.choice([2, 3])), label + 1
    for _ in range(hyper):
        for t in rng.choice(tensors, size=int(rng.integers(3, 6)), replace=False):
            inputs[int(t)].append(label)
        sizes[label], label = 2, label + 1
    output = [label, label + 1]
    inputs[0].append(label)
    for t in (3, 9, 15):
        inputs[t].append(label + 1)
    sizes[label], sizes[label + 1] = 3, 2
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "hyper.json").write_text(json.dumps({"inputs": inputs, "output": output,
                                                "size_dict": {str(k): v for k, v in sizes.items()}}))
    return f"network: {tmp / 'hyper.json'}, seed: 4"


@pytest.mark.parametrize("expression,sizes", [
    ("ab,ac,ad,bcd,ae->e", "{a: 3, b: 4, c: 5, d: 2, e: 3}"),      # a closed hyperindex
    ("ab,ac,ad,a->bcd", "{a: 4, b: 3, c: 2, d: 5}"),                # ... every holder keeps other legs open
    ("xa,xb,xc,ya,yb,yc,xy->x", "{x: 3, y: 2, a: 4, b: 2, c: 3}"),  # an open hyperindex (x) and a closed one (y)
    ("ab,ab,ab,ab->", "{a: 6, b: 5}"),                              # two hyperindices over the same holders
])
def test_hyperindex_einsum_networks_match_numpy(tmp, expression, sizes):
    _, run_dir = committed_run(tmp, contract_spec(
        f'einsum: {{expression: "{expression}", sizes: {sizes}, seed: 3}}'))
    expected, _ = einsum_of_network(run_dir)
    got, _ = value_of(run_dir)
    assert np.linalg.norm(got - expected) <= 1e-12 * max(1, np.linalg.norm(expected))


def test_a_random_hypergraph_sliced_and_on_two_ranks(tmp):
    """24 tensors, 20 hyperindices of 3-5 holders: the hyper-optimizer's path, unsliced and sliced
    to fit 4 KiB (hyperindices among the sliced modes), matches numpy.einsum; two ranks give one
    rank's bytes (and a plan sharded over two ranks its value)."""
    source = hypergraph_file(tmp)
    _, whole = committed_run(tmp / "whole", contract_spec(source))
    _, sliced = committed_run(tmp / "sliced", contract_spec(source, budget="4KiB"))
    expected, net = einsum_of_network(whole)
    a, attrs_a = value_of(whole)
    b, attrs_b = value_of(sliced)
    assert attrs_a["slices"] == 1 and attrs_b["slices"] > 1
    for got in (a, b):
        assert np.linalg.norm(got - expected) <= 1e-12 * np.linalg.norm(expected)
    with h5py.File(sliced / "outputs" / "plan.h5") as f:
        sliced_modes = json.loads(bytes(f["plan"][()]).decode())["sliced"]
    holders = {}
    for modes in net["inputs"]:
        for m in modes:
            holders[m] = holders.get(m, 0) + 1
    assert any(holders[m] > 2 for m in sliced_modes), sliced_modes

    # The one-rank plan on two ranks (they share the slices): the same bytes. A plan for two ranks
    # (its large steps sharded, the shards exchanged): the value, to rounding.
    one = distributed_run(tmp / "one", spec_text(source, "complex128", 1, budget="4KiB"), 1)
    shared = distributed_run(tmp / "shared", spec_text(source, "complex128", 1, budget="4KiB"), 2)
    sharded = distributed_run(tmp / "sharded", spec_text(source, "complex128", 2, budget="4KiB", large="1KiB"), 2)
    assert value_of(one)[0].tobytes() == value_of(shared)[0].tobytes()
    with h5py.File(sharded / "outputs" / "plan.h5") as f:
        assert json.loads(bytes(f["plan"][()]).decode())["distribution"]["steps"], "no step was distributed"
    assert np.linalg.norm(value_of(sharded)[0] - expected) <= 1e-12 * np.linalg.norm(expected)


# ----------------------------------------------------------------------------- simplification

def simplified_circuit_spec(source, bits):
    return f"""name: simplified
steps:
  - id: net
    stage: tn.build
    params: {{{source}, {bits}, simplify: true}}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{max_seconds: 600, max_tries: 32, seed: 0}}
  - id: plan
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{precision: complex128, budget: 16KiB, bandwidth: 1.0e10, gemm_rate: 1.0e11}}
  - id: amps
    stage: tn.contract
    inputs: {{network: net, plan: plan}}
  - id: sv
    stage: tn.statevector
    params: {{{source}, {bits}, precision: complex128}}
"""


@pytest.mark.parametrize("source,bits", [
    ("random: {rows: 3, cols: 4, cycles: 8, seed: 1}", "random_bitstrings: {count: 3, seed: 9}"),
    ("random: {rows: 3, cols: 3, cycles: 10, seed: 2, gate: cz}", "random_bitstrings: {count: 3, seed: 9}, open: [1, 4]"),
    ("qaoa: {nodes: 10, p: 2, seed: 4}", "random_bitstrings: {count: 2, seed: 3}"),
    ("lattice: {kind: triangular, rows: 3, cols: 3, steps: 3, dt: 0.2, h: 0.7, seed: 6}", "bitstrings: ['010101010']"),
])
def test_simplified_circuits_keep_their_amplitudes(tmp, source, bits):
    """Diagonal gates (CZ, ZZ rotations) fuse their wires into hyperindices, |0> states fix the
    first gates' inputs, and small tensors vanish into their neighbours; the projections are left
    alone, so one plan still serves every bitstring (and open qubits stay open). Against the state
    vector, sliced (16 KiB), to 1e-12."""
    _, run_dir = committed_run(tmp, simplified_circuit_spec(source, bits))
    with h5py.File(run_dir / "outputs" / "amps.h5") as f:
        a, bits_a = f["amplitudes"][()], f["bitstrings"][()]
    with h5py.File(run_dir / "outputs" / "sv.h5") as f:
        s, bits_s = f["amplitudes"][()], f["bitstrings"][()]
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        report = json.loads(f.attrs["simplification"])
        projections = [t for t in f["tensors"] if f["tensors"][t].attrs["tag"].startswith("<")]
    assert (bits_a == bits_s).all()
    assert np.linalg.norm(a - s) <= 1e-12 * np.linalg.norm(s)
    assert report["tensors_after"] < report["tensors_before"] and report["fixed"] > 0, report
    assert len(projections) > 0
    if "cz" in source or "qaoa" in source or "lattice" in source:
        assert report["fused"] > 0 and report["hyperindices"] > 0, report


def test_a_copy_tensor_becomes_a_hyperindex(tmp):
    """A network written by another program with an explicit 4-leg copy tensor (delta) joining
    four matrices: simplified, the copy tensor is gone and its legs are one mode held by the four
    (then the matrices' own legs are absorbed); the value is numpy.einsum's."""
    tmp.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    inputs = [[0, 1, 2, 3], [0, 4], [1, 5], [2, 6], [3, 7], [4, 5, 6, 7, 8]]
    sizes = {m: 3 for m in range(8)}
    sizes[8] = 2
    copy = np.zeros((3, 3, 3, 3))
    for i in range(3):
        copy[i, i, i, i] = 1
    tensors = [copy] + [rng.standard_normal((3, 3)) for _ in range(4)] + [rng.standard_normal((3, 3, 3, 3, 2))]
    (tmp / "net.json").write_text(json.dumps({"inputs": inputs, "output": [8],
                                              "size_dict": {str(k): v for k, v in sizes.items()}}))
    with h5py.File(tmp / "data.h5", "w") as f:
        for i, t in enumerate(tensors):
            f[f"t{i}"] = t
    for simplify, name in (("[diagonal]", "fused"), ("true", "all")):
        _, run_dir = committed_run(tmp / name, contract_spec(
            f"network: {tmp / 'net.json'}, tensors: {tmp / 'data.h5'}, simplify: {simplify}"))
        got, _ = value_of(run_dir)
        expected = np.einsum("abcd,ae,bf,cg,dh,efghi->i", *tensors)
        assert np.linalg.norm(got - expected) <= 1e-12 * np.linalg.norm(expected)
        with h5py.File(run_dir / "outputs" / "net.h5") as f:
            report = json.loads(f.attrs["simplification"])
            net = json.loads(bytes(f["network"][()]).decode())
        assert report["fused"] == 3, report
        if name == "fused":  # the copy tensor is now the all-ones vector on the hyperindex its legs became
            assert report["hyperindices"] == 1 and [len(m) for m in net["inputs"]] == [1, 2, 2, 2, 2, 5], net
        else:
            assert len(net["inputs"]) < 6 and report["absorbed"] > 0, report


def test_a_low_rank_tensor_is_split(tmp):
    """A 4-leg tensor that is the outer product of two matrices (rank 1 across its legs' halves)
    plus a little of a second product (rank 2): the split rule cuts it in two (2 x (9 x 2) values
    instead of 81) and the value stays numpy.einsum's to 1e-12."""
    tmp.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    a, b, c, d = (rng.standard_normal((3, 3)) for _ in range(4))
    low_rank = np.einsum("ij,kl->ijkl", a, b) + 0.1 * np.einsum("ik,jl->ijkl", c, d).transpose(0, 2, 1, 3)
    others = [rng.standard_normal((3, 3, 2)), rng.standard_normal((3, 3))]
    inputs, sizes = [[0, 1, 2, 3], [0, 1, 4], [2, 3]], {0: 3, 1: 3, 2: 3, 3: 3, 4: 2}
    (tmp / "net.json").write_text(json.dumps({"inputs": inputs, "output": [4],
                                              "size_dict": {str(k): v for k, v in sizes.items()}}))
    with h5py.File(tmp / "data.h5", "w") as f:
        for i, t in enumerate([low_rank] + others):
            f[f"t{i}"] = t
    _, run_dir = committed_run(tmp / "run", contract_spec(
        f"network: {tmp / 'net.json'}, tensors: {tmp / 'data.h5'}, simplify: [split]"))
    got, _ = value_of(run_dir)
    expected = np.einsum("ijkl,ijm,kl->m", low_rank, *others)
    assert np.linalg.norm(got - expected) <= 1e-12 * np.linalg.norm(expected)
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        report = json.loads(f.attrs["simplification"])
        net = json.loads(bytes(f["network"][()]).decode())
    assert report["split"] == 1 and report["tensors_after"] == 4, report
    assert sorted(net["size_dict"].values()).count(2) == 2, net  # the new bond has extent 2 (rank 2)


def test_tropical_networks_simplify_in_their_semiring(tmp):
    """Maximum independent sets of a King's subgraph, simplified in the tropical semiring (its zero
    is a count of 0): the same (size, count) as unsimplified."""
    source = "independent_sets: {rows: 5, cols: 5, fill: 0.8, seed: 4, semiring: tropical}"
    values = {}
    for simplify in ("false", "true"):
        _, run_dir = committed_run(tmp / simplify, contract_spec(f"{source}, simplify: {simplify}"))
        values[simplify] = value_of(run_dir)[0]
    assert values["true"].tobytes() == values["false"].tobytes()


@pytest.mark.parametrize("value,message", [
    ("[diagonal, trace]", 'params.simplify[1]: got "trace"; expected one of diagonal, column, rank, split'),
    ("3", "params.simplify: got an integer; expected true or false or a list"),
])
def test_bad_simplify_parameters_exit_2_with_one_line(tmp, value, message):
    tmp.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp / "spec.yaml", contract_spec(
        f'einsum: {{expression: "ab,bc->ac", sizes: {{a: 2, b: 2, c: 2}}}}, simplify: {value}'))
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    one_line_error(r, message)
