"""The networks of seed 000's Fig. 1 beyond circuits (issue 20): tn.build's independent_sets (Fig. 1
(c), a King's subgraph) and surface_code (Fig. 1 (b), maximum-likelihood decoding), contracted by
tn.contract on one rank and distributed over two, against independent oracles: OEIS A063443 (non-
attacking kings on an n x n board) and a row-by-row transfer matrix for the independent sets;
enumeration of every error configuration for the decoding probabilities, with the code's checks
and logical operator rebuilt here and checked algebraically. Exact in complex128 to 1e-12."""
import itertools
import json

import h5py
import numpy as np
import pytest

from conftest import DEVICE, ROOT, committed_run, one_line_error, run, write_spec
from test_tn_distributed import distributed_run, spec_text


# How a decoding network is written: parity checks and copy tensors as built, the same simplified
# (copy tensors become hyperindices), or the Fourier form (detectors hyperindices).
DECODING_FORMS = ["checks", "simplified", "fourier"]


def contracted(tmp, source, simplify=False, form=None):
    """The value and the instance; with `simplify`, the network simplified first (its copy tensors
    hyperindices), and the instance gains what simplification did. `form` (one of DECODING_FORMS)
    sets both for a decoding source."""
    if form is not None:
        simplify = form == "simplified"
        if form == "fourier":
            assert source.endswith("}")
            source = source[:-1] + ", form: fourier}"
    if simplify:
        source += ", simplify: true"
    _, run_dir = committed_run(tmp, spec_text(source, "complex128", 1, budget="64MiB"))
    with h5py.File(run_dir / "outputs" / "value.h5") as f:
        value = f["value"][()].reshape(-1)
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        about = json.loads(f.attrs["problem"])
        if simplify:
            about["simplification"] = json.loads(f.attrs["simplification"])
            assert about["simplification"]["tensors_after"] == f.attrs["tensors"]
            assert about["simplification"]["tensors_after"] < about["simplification"]["tensors_before"]
    return value, about


# ----------------------------------------------------------------------------- independent sets

def king_transfer_matrix(rows, cols, kept, fugacity):
    """sum over the independent sets S of the King's subgraph of fugacity^|S|, row by row: a
    row's state is the set of its occupied kept sites; consecutive rows may not touch (vertically
    or diagonally)."""
    def row_states(r):
        for bits in range(1 << cols):
            occupied = [c for c in range(cols) if bits >> c & 1]
            if any((r, c) not in kept for c in occupied):
                continue
            if any(bits >> c & 1 and bits >> (c + 1) & 1 for c in range(cols - 1)):
                continue
            yield bits, len(occupied)
    weights = {0: 1.0}
    for r in range(rows):
        nxt = {}
        for bits, n in row_states(r):
            spread = bits | bits << 1 | bits >> 1
            total = sum(w for prev, w in weights.items() if not prev & spread)
            if total:
                nxt[bits] = total * fugacity ** n
        weights = nxt
    return sum(weights.values())


def king_maximum_sets(rows, cols, kept):
    """(the largest |S| of an independent set S of the King's subgraph, how many S reach it), row
    by row as king_transfer_matrix, each row state keeping its best size and that size's count."""
    best = {0: (0, 1)}
    for r in range(rows):
        nxt = {}
        for bits in range(1 << cols):
            occupied = [c for c in range(cols) if bits >> c & 1]
            if any((r, c) not in kept for c in occupied) or bits & bits << 1:
                continue
            spread = bits | bits << 1 | bits >> 1
            top, count = -1, 0
            for prev, (size, n) in best.items():
                if prev & spread:
                    continue
                if size > top:
                    top, count = size, n
                elif size == top:
                    count += n
            if count:
                nxt[bits] = (top + len(occupied), count)
        best = nxt
    top = max(size for size, _ in best.values())
    return top, sum(n for size, n in best.values() if size == top)


@pytest.mark.parametrize("n,count", [(2, 5), (3, 35), (4, 314), (5, 6427)])
def test_independent_sets_of_full_king_graphs_match_oeis_a063443(tmp, n, count):
    value, about = contracted(tmp, f"independent_sets: {{rows: {n}, cols: {n}, fill: 1.0}}")
    assert about["vertices"] == n * n
    assert abs(value[0] - count) <= 1e-12 * count


@pytest.mark.parametrize("rows,cols,fill,seed,fugacity", [(4, 5, 0.7, 3, 0.5), (6, 5, 0.8, 11, 1.3), (3, 7, 0.4, 2, 2.0)])
def test_independent_sets_of_king_subgraphs_match_a_transfer_matrix(tmp, rows, cols, fill, seed, fugacity):
    value, about = contracted(tmp, f"independent_sets: {{rows: {rows}, cols: {cols}, fill: {fill}, seed: {seed}, "
                                   f"fugacity: {fugacity}}}")
    kept = {tuple(s) for s in about["sites"]}
    assert 0 < len(kept) < rows * cols  # (a subgraph, not the full grid)
    # The edges the network was built from are exactly the king's moves between kept sites.
    sites = [tuple(s) for s in about["sites"]]
    edges = {frozenset((sites[u], sites[v])) for u, v in about["edges"]}
    expected_edges = {frozenset((a, b)) for a, b in itertools.combinations(sites, 2)
                      if max(abs(a[0] - b[0]), abs(a[1] - b[1])) == 1}
    assert edges == expected_edges
    expected = king_transfer_matrix(rows, cols, kept, fugacity)
    assert abs(value[0] - expected) <= 1e-12 * expected


def test_independent_sets_distributed_over_two_ranks_equal_the_transfer_matrix(tmp):
    source = "independent_sets: {rows: 6, cols: 6, fill: 0.9, seed: 5}"
    run_dir = distributed_run(tmp, spec_text(source, "complex128", 2, budget="128KiB", large="16KiB"), 2)
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        plan = json.loads(bytes(f["plan"][()]).decode())
    assert len(plan["distribution"]["chains"]) >= 1  # (something was sharded)
    with h5py.File(run_dir / "outputs" / "value.h5") as f:
        value = f["value"][()].reshape(-1)
    with h5py.File(run_dir / "outputs" / "net.h5") as f:
        about = json.loads(f.attrs["problem"])
    expected = king_transfer_matrix(6, 6, {tuple(s) for s in about["sites"]}, 1.0)
    assert abs(value[0] - expected) <= 1e-12 * expected


# ----------------------------------------------------------------------------- surface code

def rotated_surface_code(d):
    """Z and X checks of the distance-d rotated surface code (data qubit (r, c) = r d + c), built
    from the plaquettes of the dual lattice: weight 4 inside; weight-2 Z checks on the left and
    right edges, X checks on the top and bottom ones."""
    z, x = [], []
    for i in range(d + 1):
        for j in range(d + 1):
            qubits = [r * d + c for r, c in ((i - 1, j - 1), (i - 1, j), (i, j - 1), (i, j)) if 0 <= r < d and 0 <= c < d]
            inside = 0 < i < d and 0 < j < d
            if (i + j) % 2:
                if inside or (0 < i < d and j in (0, d)):
                    z.append(sorted(qubits))
            elif inside or (0 < j < d and i in (0, d)):
                x.append(sorted(qubits))
    return z, x


def gf2_rank(rows):
    m = np.array(rows, dtype=np.uint8) % 2
    rank = 0
    for col in range(m.shape[1]):
        pivot = next((r for r in range(rank, m.shape[0]) if m[r, col]), None)
        if pivot is None:
            continue
        m[[rank, pivot]] = m[[pivot, rank]]
        for r in range(m.shape[0]):
            if r != rank and m[r, col]:
                m[r] ^= m[rank]
        rank += 1
    return rank


def decoding_by_enumeration(d, rounds, p, q, syndrome, z_checks, logical):
    """[P(syndrome, class 0), P(syndrome, class 1)] summed over every configuration of the
    data flips (rounds x d^2) and the misreadings (every round but the last)."""
    S, n_data = len(z_checks), rounds * d * d
    n = n_data + (rounds - 1) * S
    configs = np.arange(1 << n, dtype=np.uint64)
    bit = [(configs >> np.uint64(k)) & np.uint64(1) for k in range(n)]
    detectors = [np.zeros(1 << n, dtype=np.uint64) for _ in range(S * rounds)]
    cls = np.zeros(1 << n, dtype=np.uint64)
    data_flips = np.zeros(1 << n, dtype=np.uint64)
    for t in range(rounds):
        for qb in range(d * d):
            b = bit[t * d * d + qb]
            data_flips += b
            for s, check in enumerate(z_checks):
                if qb in check:
                    detectors[t * S + s] ^= b
            if qb in logical:
                cls ^= b
    misreads = np.zeros(1 << n, dtype=np.uint64)
    for t in range(rounds - 1):
        for s in range(S):
            b = bit[n_data + t * S + s]
            misreads += b
            detectors[t * S + s] ^= b
            detectors[(t + 1) * S + s] ^= b
    match = np.ones(1 << n, dtype=bool)
    for k, det in enumerate(detectors):
        match &= det == np.uint64(int(syndrome[k]))
    weight = p ** data_flips * (1 - p) ** (n_data - data_flips.astype(np.int64))
    if rounds > 1:
        n_meas = (rounds - 1) * S
        weight = weight * q ** misreads * (1 - q) ** (n_meas - misreads.astype(np.int64))
    return np.array([weight[match & (cls == 0)].sum(), weight[match & (cls == 1)].sum()])


def test_the_surface_code_checks_and_logical_are_a_distance_d_code():
    for d in (3, 5, 7):
        z, x = rotated_surface_code(d)
        assert len(z) == len(x) == (d * d - 1) // 2
        dense = lambda rows: [[int(qb in r) for qb in range(d * d)] for r in rows]
        assert all(len(set(a) & set(b)) % 2 == 0 for a in z for b in x)  # the checks commute
        z_logical = [list(range(d))]  # Z on row 0: commutes with every X check, not a product of Z checks
        assert all(len(set(range(d)) & set(b)) % 2 == 0 for b in x)
        assert gf2_rank(dense(z) + dense(z_logical)) == gf2_rank(dense(z)) + 1
        assert gf2_rank(dense(z)) + gf2_rank(dense(x)) == d * d - 1  # one logical qubit


@pytest.mark.parametrize("source,rounds", [
    ("surface_code: {distance: 3, p: 0.1, seed: 3}", 1),
    ("surface_code: {distance: 3, p: 0.2, seed: 8}", 1),
    ("surface_code: {distance: 3, rounds: 2, p: 0.08, q: 0.03, seed: 1}", 2),
    ("surface_code: {distance: 3, rounds: 2, p: 0.1, q: 0.2, syndrome: '01101001'}", 2),
])
@pytest.mark.parametrize("form", DECODING_FORMS)
def test_surface_code_decoding_matches_enumeration(tmp, source, rounds, form):
    value, about = contracted(tmp, source, form=form)
    assert about.get("form", "checks") == ("fourier" if form == "fourier" else "checks")
    d, p, q = about["distance"], about["p"], about["q"]
    z, _ = rotated_surface_code(d)
    assert sorted(map(sorted, about["checks"])) == sorted(z)
    assert about["logical"] == list(range(d)) and about["rounds"] == rounds
    assert len(about["syndrome"]) == about["detectors"] == len(z) * rounds
    expected = decoding_by_enumeration(d, rounds, p, q, about["syndrome"], z, set(range(d)))
    assert expected.sum() > 0
    assert np.max(np.abs(value - expected)) <= 1e-12 * expected.sum()
    if about["sampled"]:
        assert about["true_observables"] in ("0", "1")


def test_surface_code_probabilities_of_all_syndromes_sum_to_one(tmp):
    """Code capacity at d = 3: the 16 syndromes' [P(s, 0), P(s, 1)] add up to 1."""
    total = 0.0
    for k in range(16):
        value, _ = contracted(tmp / f"s{k}", f"surface_code: {{distance: 3, p: 0.15, syndrome: '{k:04b}'}}")
        total += value.sum().real
    assert abs(total - 1) < 1e-12


@pytest.mark.parametrize("source,message", [
    ("surface_code: {distance: 4}", "surface_code: distance = 4; expected an odd number from 3 to 51"),
    ("surface_code: {distance: 3, rounds: 2, syndrome: '0101'}", "surface_code: syndrome has 4 characters; expected 8"),
    ("independent_sets: {rows: 3, cols: 3, fill: 0.0}", "independent_sets: no site of the 3 x 3 grid kept"),
    ("independent_sets: {rows: 2, cols: 2}, surface_code: {distance: 3}", "2 sources given"),
])
def test_bad_problem_parameters_exit_2_with_one_line(tmp, source, message):
    spec = write_spec(tmp / "spec.yaml", f"""name: bad
steps:
  - id: net
    stage: tn.build
    params: {{{source}}}
""")
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    one_line_error(r, message)
    assert not (tmp / "run" / "outputs" / "net.h5").exists()


def test_the_fig1_workflow(tmp):
    """workflows/tn-fig1.yaml: the King's subgraph's count equals the transfer matrix's; both
    decoding results are probabilities of a syndrome that occurred (positive, at most 1 together)
    whose larger one names the sampled error's class (for these seeds)."""
    r = run(["run", ROOT / "workflows" / "tn-fig1.yaml", "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    out = tmp / "run" / "outputs"
    with h5py.File(out / "king.h5") as f:
        about = json.loads(f.attrs["problem"])
    with h5py.File(out / "count.h5") as f:
        count = f["value"][()].reshape(-1)[0]
    expected = king_transfer_matrix(8, 8, {tuple(s) for s in about["sites"]}, 1.0)
    assert abs(count - expected) <= 1e-12 * expected
    with h5py.File(out / "mis.h5") as f:  # (tropical: the same graph's maximum independent sets)
        assert (f["exponent"][0], f["count"][0]) == king_maximum_sets(8, 8, {tuple(s) for s in about["sites"]})
    with h5py.File(out / "code.h5") as f:
        code = json.loads(f.attrs["problem"])
    with h5py.File(out / "decode.h5") as f:
        p = f["value"][()].reshape(-1).real
    assert p.shape == (2,) and (p > 0).all() and p.sum() <= 1
    assert int(np.argmax(p)) == int(code["true_observables"], 2)
    # (b') circuit-level noise from stim's model: 24 detectors, 219 mechanisms, a non-trivial syndrome
    with h5py.File(out / "circuit.h5") as f:
        circuit = json.loads(f.attrs["problem"])
    with h5py.File(out / "circuit_decode.h5") as f:
        p = f["value"][()].reshape(-1).real
    assert (circuit["detectors"], circuit["mechanisms"]) == (24, 219) and "1" in circuit["syndrome"]
    assert p.shape == (2,) and (p > 0).all() and p.sum() <= 1
    assert int(np.argmax(p)) == int(circuit["true_observables"], 2)
    # The built networks' files (with the attribute 'problem') match tn.build's output schema.
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "schemas" / "outputs" / "tn.build.json").read_text())
    for step in ("king", "code", "circuit"):
        r = run(["inspect", out / f"{step}.h5", "--json"])
        assert r.code == 0, r
        layout = json.loads(r.out)
        assert "problem" in layout["attributes"]
        jsonschema.validate(layout, schema)


# ----------------------------------------------------------------------------- detector error models

def decoding_by_convolution(mechanisms, detectors, observables, syndrome):
    """P(syndrome, observables) for independent mechanisms (p, detectors, observables): the
    distribution over all detector and observable bits, one mechanism at a time (an XOR
    convolution), then the syndrome's slice, L0 slowest."""
    width = detectors + observables
    dist = np.zeros(1 << width)
    dist[0] = 1.0
    index = np.arange(1 << width)
    for p, dets, obs in mechanisms:
        mask = 0
        for d in dets:
            mask ^= 1 << d
        for o in obs:
            mask ^= 1 << (detectors + o)
        dist = (1 - p) * dist + p * dist[index ^ mask]
    s = sum(int(c) << k for k, c in enumerate(syndrome))
    return np.array([dist[s | sum(((a >> (observables - 1 - o)) & 1) << (detectors + o) for o in range(observables))]
                     for a in range(1 << observables)])


HANDWRITTEN_DEM = """# two observables, a repeat block with shifted detectors, a ^ and declarations
error(0.1) D0 D1
error(0.05) D1 L0
repeat 2 {
    error(0.2) D0 D2 ^ D2 D3   # D2 twice: cancels
    error(0.02) D3 L1
    shift_detectors 2
}
error(0.3) L0 L1
error(0.15) D0 D1 D2
detector(1, 2) D1
logical_observable L1
"""
# The same, expanded by hand: (p, detectors, observables); the block's second pass is shifted by 2.
HANDWRITTEN = [(0.1, [0, 1], []), (0.05, [1], [0]),
               (0.2, [0, 3], []), (0.02, [3], [1]),
               (0.2, [2, 5], []), (0.02, [5], [1]),
               (0.3, [], [0, 1]), (0.15, [4, 5, 6], [])]


@pytest.mark.parametrize("syndrome", [None, "1101011", "0000000"])
@pytest.mark.parametrize("form", DECODING_FORMS)
def test_detector_error_model_decoding_matches_the_convolution(tmp, syndrome, form):
    (tmp / "model.dem").write_text(HANDWRITTEN_DEM)
    given = f", syndrome: '{syndrome}'" if syndrome else ", seed: 2"
    value, about = contracted(tmp, f"detector_error_model: {{file: model.dem{given}}}", form=form)
    assert (about["detectors"], about["observables"], about["mechanisms"]) == (7, 2, 8)
    expected = decoding_by_convolution(HANDWRITTEN, 7, 2, about["syndrome"])
    assert value.shape == (4,)
    assert np.max(np.abs(value - expected)) <= 1e-12 * max(expected.sum(), 1e-300)
    if syndrome is None:
        assert len(about["true_observables"]) == 2 and expected[int(about["true_observables"], 2)] > 0


@pytest.mark.parametrize("form", DECODING_FORMS)
@pytest.mark.parametrize("p,errors", [(0.01, None), (0.001, 8)])
def test_stim_circuit_level_surface_code_decoding_matches_the_convolution(tmp, form, p, errors):
    """Seed 000's Fig. 1 (b) noise model: a stim rotated memory experiment with circuit-level
    depolarising noise, its detector error model decoded for a syndrome stim sampled (or, at p =
    0.001, the syndrome of 8 mechanisms chosen at random: P(syndrome) near 1e-9 against terms of
    order 1, where the Fourier form's signed terms cancel to 2e-12, so it is held to 1e-9 there and
    the others to 1e-12); simplified, the mechanisms' copy tensors become
    hyperindices (a mechanism flips up to four detectors and observables), and the maximum-
    likelihood class is the convolution's in every form."""
    stim = pytest.importorskip("stim", reason="stim not installed: run scripts/setup.sh --test-oracles")
    circuit = stim.Circuit.generated("surface_code:rotated_memory_z", distance=3, rounds=2,
                                     after_clifford_depolarization=p, before_measure_flip_probability=p,
                                     after_reset_flip_probability=p)
    dem = circuit.detector_error_model(decompose_errors=False)
    (tmp / "memory.dem").write_text(str(dem))
    mechanisms = []
    for inst in dem.flattened():
        if inst.type != "error":
            continue
        dets, obs = set(), set()
        for t in inst.targets_copy():
            if t.is_relative_detector_id():
                dets ^= {t.val}
            elif t.is_logical_observable_id():
                obs ^= {t.val}
        mechanisms.append((inst.args_copy()[0], sorted(dets), sorted(obs)))
    if errors is None:
        detections, _ = circuit.compile_detector_sampler(seed=3).sample(1, separate_observables=True)
        syndrome = "".join("1" if b else "0" for b in detections[0])
    else:
        flipped = np.zeros(dem.num_detectors, dtype=int)
        for i in np.random.default_rng(5).choice(len(mechanisms), size=errors, replace=False):
            flipped[mechanisms[i][1]] ^= 1
        syndrome = "".join(map(str, flipped))
    value, about = contracted(tmp, f"detector_error_model: {{file: memory.dem, syndrome: '{syndrome}'}}", form=form)
    assert (about["detectors"], about["observables"]) == (dem.num_detectors, dem.num_observables)
    expected = decoding_by_convolution(mechanisms, dem.num_detectors, dem.num_observables, syndrome)
    tolerance = 1e-9 if form == "fourier" else 1e-12
    assert np.max(np.abs(value - expected)) <= tolerance * expected.sum()
    assert np.argmax(value.real) == np.argmax(expected)
    if form == "simplified":
        assert about["simplification"]["hyperindices"] > 0, about["simplification"]


@pytest.mark.parametrize("text,message", [
    ("error(0.1) D0 L0\nflip D1\n", "line 2: instruction 'flip'; expected error, detector"),
    ("error(1.5) D0 L0\n", "line 1: expected error(p) with p a probability"),
    ("error(0.1) D0 X3 L0\n", "line 1: target 'X3'; expected D<k>, L<k> or ^"),
    ("repeat 2 {\nerror(0.1) D0 L0\n", "line 1: repeat block without its '}'"),
    ("error(0.1) D0\n", "no logical observable"),
    # Sizes are counted before expanding (a repeat of 10^9 grew the model until the OOM killer came).
    ("repeat 1000000000 {\n  error(0.1) D0 L0\n  shift_detectors 1\n}\n",
     "line 1: 'repeat 1000000000 {' takes the model to 2000000001 instructions (repeat blocks expanded); "
     "expected at most 1048576 (2^20)"),
    ("error(0.1) D0 L0\nrepeat 2 {\n  repeat 600000 {\n    error(0.1) D0 L0\n  }\n}\n",
     "line 2: 'repeat 2 {' takes the model to 1200004 instructions"),
    ("shift_detectors 2000000\nerror(0.1) D0 L0\n", "line 2: 'error(0.1) D0 L0' takes the model to 2000001 detectors"),
])
def test_bad_detector_error_models_exit_2_naming_the_line(tmp, text, message):
    (tmp / "bad.dem").write_text(text)
    spec = write_spec(tmp / "spec.yaml", """name: bad
steps:
  - id: net
    stage: tn.build
    params: {detector_error_model: {file: bad.dem}}
""")
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    one_line_error(r, "detector_error_model: 'bad.dem'", message)


def test_stim_repeat_blocks_are_read_as_stim_flattens_them(tmp):
    """A longer memory experiment, whose model stim writes with repeat blocks and shifted
    detectors: the network's detectors, observables and mechanisms are stim's."""
    stim = pytest.importorskip("stim", reason="stim not installed: run scripts/setup.sh --test-oracles")
    circuit = stim.Circuit.generated("surface_code:rotated_memory_z", distance=3, rounds=12,
                                     after_clifford_depolarization=0.01, before_measure_flip_probability=0.01)
    dem = circuit.detector_error_model(decompose_errors=True)  # (with ^ separators)
    assert "repeat" in str(dem) and "^" in str(dem)
    (tmp / "memory.dem").write_text(str(dem))
    spec = write_spec(tmp / "spec.yaml", """name: dem
steps:
  - id: net
    stage: tn.build
    params: {detector_error_model: {file: memory.dem, seed: 1}}
""")
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    with h5py.File(tmp / "run" / "outputs" / "net.h5") as f:
        about = json.loads(f.attrs["problem"])
    errors = [i for i in dem.flattened() if i.type == "error"]
    assert (about["detectors"], about["observables"], about["mechanisms"]) == \
        (dem.num_detectors, dem.num_observables, len(errors))
    assert len(about["syndrome"]) == dem.num_detectors
