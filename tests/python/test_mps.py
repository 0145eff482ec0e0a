"""mps.init and mps.tebd end to end: product and random states checked exactly (the random state
against the state vector it represents), TEBD against a numpy state vector that applies the same
Trotter gate sequence (to 1e-10), against the exact L = 8 XXZ table of
../shared/data/mps/README.md, against the free-fermion correlation-matrix formulas (XX chain),
truncation, and bad inputs refused with exit 2. numpy only (no scipy)."""
import re

import h5py
import numpy as np

import pytest

from conftest import DEVICE, file_digest, one_line_error, run, write_spec


def run_steps(tmp, steps, name="mps", env=None):
    """Runs a workflow of `steps` (YAML text of the steps list) under tmp; returns (result, outputs folder)."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp / f"{name}.yaml", f"name: {name}\nsteps:\n{steps}")
    r = run(["run", spec, "--run-dir", tmp / f"run-{name}", "--device", DEVICE], env=env)
    return r, tmp / f"run-{name}" / "outputs"


def init_step(params, id="psi"):
    return f"  - id: {id}\n    stage: mps.init\n    params: {params}\n"


def tebd_step(params, id="evo", state="psi"):
    return f"  - id: {id}\n    stage: mps.tebd\n    inputs: {{state: {state}}}\n    params: {params}\n"


def load_mps(path):
    """The MPS of an output file: its bonds (charges, lambda) and dense site tensors B[j] of shape
    (chi_j, d, chi_{j+1}), built from the flat layout of docs/mps.md."""
    with h5py.File(path) as f:
        L, d, N = int(f.attrs["L"]), int(f.attrs["d"]), int(f.attrs["total_charge"])
        off, charges, lam = f["bond_offsets"][()], f["bond_charges"][()], f["lambda"][()]
        blocks, boff, values = f["blocks"][()], f["block_offsets"][()], f["values"][()]
    bonds = [(charges[off[k]:off[k + 1]], lam[off[k]:off[k + 1]]) for k in range(L + 1)]
    B = [np.zeros((len(bonds[j][0]), d, len(bonds[j + 1][0])), complex) for j in range(L)]
    for b, (site, cl, cr, r0, c0, rows, cols) in enumerate(blocks):
        assert 0 <= cl - cr <= d - 1
        assert (bonds[site][0][r0:r0 + rows] == cl).all() and (bonds[site + 1][0][c0:c0 + cols] == cr).all()
        B[site][r0:r0 + rows, cl - cr, c0:c0 + cols] = values[boff[b]:boff[b + 1]].reshape(rows, cols)
    return {"L": L, "d": d, "N": N, "bonds": bonds, "B": B}


def state_vector(m):
    """The full state, axis j = occupation of site j: sum over bond 0's indices (one per total N)
    weighted by its lambda (sqrt P(N); a single 1 unless the boundary is mixed)."""
    psi = np.asarray(m["bonds"][0][1], complex).reshape(1, -1)
    for Bj in m["B"]:
        psi = np.einsum("pa,ajb->pjb", psi, Bj).reshape(-1, Bj.shape[2])
    return psi.reshape([m["d"]] * m["L"])


def schmidt(psi, k):
    d = psi.shape[0]
    s = np.linalg.svd(psi.reshape(d ** k, -1), compute_uv=False)
    return s[s > 1e-15]


def entropies(psi, k):
    p = schmidt(psi, k) ** 2
    return -np.sum(p * np.log(p)), -np.log(np.sum(p ** 2))


def densities(psi):
    L = psi.ndim
    prob = np.abs(psi) ** 2
    return np.array([np.sum(np.take(prob, 1, axis=j)) for j in range(L)])


def left_charge_distribution(psi, k, N):
    prob = np.abs(psi.reshape([2] * psi.ndim)) ** 2
    out = np.zeros(N + 1)
    for idx in np.ndindex(*prob.shape):
        out[sum(idx[:k])] += prob[idx]
    return out


def xxz_gate(J, delta, hl, hr, tau):
    """exp(-i tau h) of the bond Hamiltonian J[(S+S- + S-S+)/2 + delta SzSz] - hl Sz_l - hr Sz_r, basis
    |n_l n_r> (index 2 n_l + n_r), up = particle."""
    h = np.zeros((4, 4), complex)
    for nl in range(2):
        for nr in range(2):
            zl, zr = nl - 0.5, nr - 0.5
            h[2 * nl + nr, 2 * nl + nr] = J * delta * zl * zr - hl * zl - hr * zr
    h[1, 2] = h[2, 1] = J / 2
    w, v = np.linalg.eigh(h)
    return (v * np.exp(-1j * tau * w)) @ v.conj().T


def apply_gate(psi, g, j):
    L = psi.ndim
    psi = np.moveaxis(psi, [j, j + 1], [0, 1])
    shape = psi.shape
    psi = (g @ psi.reshape(4, -1)).reshape(shape)
    return np.moveaxis(psi, [0, 1], [j, j + 1])


def xxz_energy(psi, J, delta, h):
    """<psi|H|psi> with H = J sum [SxSx + SySy + delta SzSz] - h sum Sz."""
    L = psi.ndim
    hpsi = np.zeros_like(psi)
    for j in range(L - 1):
        term = np.zeros((4, 4), complex)
        for nl in range(2):
            for nr in range(2):
                term[2 * nl + nr, 2 * nl + nr] = J * delta * (nl - 0.5) * (nr - 0.5)
        term[1, 2] = term[2, 1] = J / 2
        hpsi = hpsi + apply_gate(psi, term, j)
    sz = np.zeros_like(psi, float)
    for idx in np.ndindex(*psi.shape):
        sz[idx] = sum(idx) - L / 2
    return (np.vdot(psi, hpsi) - h * np.vdot(psi, sz * psi)).real


def trotter_reference(psi, J, delta, h, dt, steps, order=2):
    """The circuit mps.tebd applies: Strang steps of weight w (bonds (0,1), (2,3), ... by w dt/2,
    (1,2), ... by w dt, the first again by w dt/2), w = 1 for order 2 and Suzuki's a, a, 1-4a, a, a
    for order 4; the field split half per bond, whole at the chain's ends. Yields psi after every step."""
    L = psi.ndim
    def gate(j, tau):
        return xxz_gate(J, delta, h * (1 if j == 0 else 0.5), h * (1 if j + 1 == L - 1 else 0.5), tau)
    a = 1 / (4 - 4 ** (1 / 3))
    weights = [1.0] if order == 2 else [a, a, 1 - 4 * a, a, a]
    for _ in range(steps):
        for w in weights:
            half = [gate(j, w * dt / 2) for j in range(L - 1)]
            full = [gate(j, w * dt) for j in range(L - 1)]
            for layer, gates in ((0, half), (1, full), (0, half)):
                for j in range(layer, L - 1, 2):
                    psi = apply_gate(psi, gates[j], j)
        yield psi


def read(path, *names):
    with h5py.File(path) as f:
        return [f[n][()] for n in names]


# ---------------------------------------------------------------- (a) initial states

@pytest.mark.parametrize("params,occ", [
    ("{L: 6, state: neel}", [1, 0, 1, 0, 1, 0]),
    ("{L: 5, state: neel, first: even}", [0, 1, 0, 1, 0]),
    ("{L: 6, state: domain_wall}", [1, 1, 1, 0, 0, 0]),
    ("{L: 5, state: domain_wall, filled: 4}", [1, 1, 1, 1, 0]),
    ("{L: 4, d: 3, state: fock, occupations: [2, 0, 1, 2]}", [2, 0, 1, 2]),
])
def test_product_states_are_exact(tmp, params, occ):
    r, out = run_steps(tmp, init_step(params))
    assert r.code == 0, r
    m = load_mps(out / "psi.h5")
    assert m["N"] == sum(occ) and m["L"] == len(occ)
    for k, (c, lam) in enumerate(m["bonds"]):
        assert c.tolist() == [sum(occ[k:])] and lam.tolist() == [1.0]
    psi = state_vector(m)
    expected = np.zeros([m["d"]] * len(occ), complex)
    expected[tuple(occ)] = 1
    assert np.array_equal(psi, expected)


def test_random_state_is_normalised_canonical_with_exact_schmidt_values(tmp):
    r, out = run_steps(tmp, init_step("{L: 7, d: 3, state: random, total_charge: 6, chi: 12, seed: 5}"))
    assert r.code == 0, r
    m = load_mps(out / "psi.h5")
    psi = state_vector(m)
    assert abs(np.linalg.norm(psi) - 1) < 1e-12
    # only total charge 6
    for idx in np.ndindex(*psi.shape):
        if sum(idx) != 6:
            assert psi[idx] == 0
    # right-canonical: sum_{j, b} B[a, j, b] B*[a', j, b] = 1
    for Bj in m["B"]:
        g = np.einsum("ajb,cjb->ac", Bj, Bj.conj())
        assert np.abs(g - np.eye(len(g))).max() < 1e-12
    # lambda are the state's Schmidt values at every bond, and the charges of the bonds are ascending
    chi = []
    for k in range(1, m["L"]):
        c, lam = m["bonds"][k]
        assert (np.diff(c) >= 0).all()
        np.testing.assert_allclose(np.sort(lam)[::-1], schmidt(psi, k), rtol=0, atol=1e-12)
        chi.append(len(lam))
    assert max(chi) > 4  # a random state with real entanglement, not a product state
    # the same seed gives the same bits; another seed another state
    r2, out2 = run_steps(tmp / "again", init_step("{L: 7, d: 3, state: random, total_charge: 6, chi: 12, seed: 5}"))
    assert r2.code == 0, r2
    assert read(out / "psi.h5", "values")[0].tobytes() == read(out2 / "psi.h5", "values")[0].tobytes()
    r3, out3 = run_steps(tmp / "other", init_step("{L: 7, d: 3, state: random, total_charge: 6, chi: 12, seed: 6}"))
    assert r3.code == 0, r3
    assert not np.allclose(state_vector(load_mps(out3 / "psi.h5")), psi)


# ---------------------------------------------------------------- (b) bit level: the same Trotter circuit

@pytest.mark.parametrize("delta,h,order", [(0, 0, 2), (0.5, 0.3, 2), (1, 0, 2), (0.5, 0, 4)])
def test_tebd_matches_the_same_trotter_circuit_as_a_state_vector(tmp, delta, h, order):
    L, dt, steps = 8, 0.05, 20
    r, out = run_steps(tmp, init_step("{L: 8, state: neel}") +
                       tebd_step(f"{{J: 1, delta: {delta}, h: {h}, dt: {dt}, steps: {steps}, order: {order}, "
                                 "trunc: {chi_max: 64}}"))
    assert r.code == 0, r
    times, dens, svn, s2, pn, norm, chi, energy = read(out / "evo.h5", "times", "density", "entropy_vN", "entropy_2",
                                                        "charge_distribution", "norm", "chi", "energy")
    assert times.shape == (steps + 1,) and dens.shape == (steps + 1, L) and svn.shape == (steps + 1, L - 1)
    psi0 = np.zeros([2] * L, complex)
    psi0[(1, 0) * 4] = 1
    states = [psi0] + list(trotter_reference(psi0, 1.0, delta, h, dt, steps, order))
    for t, psi in enumerate(states):
        np.testing.assert_allclose(times[t], t * dt, rtol=0, atol=1e-14)
        np.testing.assert_allclose(dens[t], densities(psi), rtol=0, atol=1e-10)
        for k in range(1, L):
            e_vn, e_2 = entropies(psi, k)
            assert abs(svn[t, k - 1] - e_vn) < 1e-10 and abs(s2[t, k - 1] - e_2) < 1e-10, (t, k)
        np.testing.assert_allclose(pn[t], left_charge_distribution(psi, L // 2, 4), rtol=0, atol=1e-10)
        assert abs(norm[t] - 1) < 1e-10
        assert abs(energy[t] - xxz_energy(psi, 1.0, delta, h)) < 1e-10, t
    # the charge is exact: the densities sum to N
    np.testing.assert_allclose(dens.sum(axis=1), 4, rtol=0, atol=1e-12)
    assert chi.max() > 1
    # the final MPS is the final state vector (up to a global phase)
    final = state_vector(load_mps(out / "evo.h5"))
    overlap = np.vdot(final, states[-1])
    assert abs(abs(overlap) - 1) < 1e-10


def test_tebd_of_a_random_state_matches_the_circuit_and_ignores_the_thread_count(tmp):
    # L = 16 with chi 256: the centre bonds' charge blocks are large enough (about 60 x 60, nine
    # of them) for the update to spread its SVDs over the threads.
    steps = "".join([init_step("{L: 16, state: random, total_charge: 8, chi: 256, seed: 11}"),
                     tebd_step("{J: 0.7, delta: 0.8, dt: 0.1, steps: 2, trunc: {chi_max: 1024}}")])
    r1, out1 = run_steps(tmp / "one", steps, env={"OMP_NUM_THREADS": "1"})
    r2, out2 = run_steps(tmp / "two", steps, env={"OMP_NUM_THREADS": "2"})
    assert r1.code == 0, r1
    assert r2.code == 0, r2
    assert read(out1 / "psi.h5", "values")[0].tobytes() == read(out2 / "psi.h5", "values")[0].tobytes()
    for name in ("values", "lambda", "density", "entropy_vN", "charge_distribution"):
        assert read(out1 / "evo.h5", name)[0].tobytes() == read(out2 / "evo.h5", name)[0].tobytes(), name
    psi0 = state_vector(load_mps(out1 / "psi.h5"))
    *_, ref = trotter_reference(psi0, 0.7, 0.8, 0.0, 0.1, 2)
    final = state_vector(load_mps(out1 / "evo.h5"))
    assert abs(abs(np.vdot(final, ref)) - 1) < 1e-10
    np.testing.assert_allclose(read(out1 / "evo.h5", "density")[0][-1], densities(ref), rtol=0, atol=1e-10)


def test_an_evolved_state_evolves_on_as_if_never_written(tmp):
    """mps.tebd's output is an MPS in the same layout: 3 + 3 steps give the bits of 6."""
    r, out = run_steps(tmp, init_step("{L: 10, state: domain_wall}") +
                       tebd_step("{delta: 0.5, dt: 0.1, steps: 3, trunc: {chi_max: 16}}", id="first") +
                       tebd_step("{delta: 0.5, dt: 0.1, steps: 3, trunc: {chi_max: 16}}", id="second", state="first") +
                       tebd_step("{delta: 0.5, dt: 0.1, steps: 6, trunc: {chi_max: 16}}", id="whole"))
    assert r.code == 0, r
    for name in ("values", "lambda", "blocks", "bond_charges"):
        assert read(out / "second.h5", name)[0].tobytes() == read(out / "whole.h5", name)[0].tobytes(), name
    assert read(out / "second.h5", "density")[0][-1].tobytes() == read(out / "whole.h5", "density")[0][-1].tobytes()


# ---------------------------------------------------------------- (c) continuous time: the README's L = 8 table

README_SZ = {
    (0, 1): [.2883624039, -.0949475297, .1125466031, -.1119344256, .1119344256, -.1125466031, .0949475297, -.2883624039],
    (0, 2): [-.0165108333, .3391393656, -.1740342496, .2004917186, -.2004917186, .1740342496, -.3391393656, .0165108333],
    (0, 3): [-.0461146153, .1034833280, .1979684456, -.0505385862, .0505385862, -.1979684456, -.1034833280, .0461146153],
    (0.5, 1): [.2893803083, -.0998267695, .1199395576, -.1190094446, .1190094446, -.1199395576, .0998267695, -.2893803083],
    (0.5, 2): [-.0089563831, .3094013654, -.1389774469, .1729428485, -.1729428485, .1389774469, -.3094013654, .0089563831],
    (0.5, 3): [-.0361635946, .0919955981, .1760706699, -.0241779250, .0241779250, -.1760706699, -.0919955981, .0361635946],
    (1, 1): [.2924128658, -.1140632342, .1413924378, -.1395560667, .1395560667, -.1413924378, .1140632342, -.2924128658],
    (1, 2): [.0135132559, .2288974406, -.0468142179, .0986024299, -.0986024299, .0468142179, -.2288974406, -.0135132559],
    (1, 3): [-.0042003529, .0629374747, .1245621889, .0231175804, -.0231175804, -.1245621889, -.0629374747, .0042003529],
}
README_S = {(0, 1): (0.506837328293, 0.381433780899), (0, 2): (0.943748159715, 0.813041473601),
            (0, 3): (1.398658955220, 1.273847938600), (0.5, 1): (0.509824545630, 0.377815637255),
            (0.5, 2): (0.987111707088, 0.839685105230), (0.5, 3): (1.447227402092, 1.297316181612),
            (1, 1): (0.512323894992, 0.366471279663), (1, 2): (1.055603347950, 0.880137874337),
            (1, 3): (1.558894738674, 1.365332700223)}
README_P = {2: [0, 0.041777, 0.567540, 0.390502, 0.000180], 3: [0.000025, 0.151107, 0.499400, 0.342980, 0.006488]}


@pytest.mark.parametrize("delta", [0, 0.5, 1])
def test_l8_quench_matches_exact_diagonalisation(tmp, delta):
    r, out = run_steps(tmp, init_step("{L: 8, state: neel}") +
                       tebd_step(f"{{delta: {delta}, dt: 0.01, steps: 300, measure_every: 100, trunc: {{chi_max: 64}}}}"))
    assert r.code == 0, r
    times, dens, svn, s2, pn = read(out / "evo.h5", "times", "density", "entropy_vN", "entropy_2",
                                    "charge_distribution")
    check_l8_table(delta, times, dens, svn, s2, pn, tol=1e-4, p_tol=1e-5)


def check_l8_table(delta, times, dens, svn, s2, pn, tol, p_tol):
    """The README's L = 8 quench at t = 1, 2, 3: <S^z>, both entropies of the centre bond to tol,
    the charge distribution (where printed) to p_tol."""
    np.testing.assert_allclose(times, [0, 1, 2, 3], rtol=0, atol=1e-12)
    for t in (1, 2, 3):
        np.testing.assert_allclose(dens[t] - 0.5, README_SZ[(delta, t)], rtol=0, atol=tol)
        assert abs(svn[t, 3] - README_S[(delta, t)][0]) < tol
        assert abs(s2[t, 3] - README_S[(delta, t)][1]) < tol
        if delta == 0 and t in README_P:
            np.testing.assert_allclose(pn[t], README_P[t], rtol=0, atol=p_tol)


@pytest.mark.parametrize("delta", [0, 0.5, 1])
def test_l8_quench_at_fourth_order_matches_exact_diagonalisation_closely(tmp, delta):
    """Suzuki's 4th order at dt = 0.05 is within about 4e-9 of the exact values (2nd order at the
    same dt is off by about 8e-5), so the table's digits hold to 1e-7."""
    r, out = run_steps(tmp, init_step("{L: 8, state: neel}") +
                       tebd_step(f"{{delta: {delta}, dt: 0.05, steps: 60, order: 4, measure_every: 20, "
                                 "trunc: {chi_max: 64}}"))
    assert r.code == 0, r
    times, dens, svn, s2, pn, energy = read(out / "evo.h5", "times", "density", "entropy_vN", "entropy_2",
                                            "charge_distribution", "energy")
    # the Neel state's energy, J delta (L-1) (-1/4), is conserved
    np.testing.assert_allclose(energy, -delta * 7 / 4, rtol=0, atol=1e-7)
    check_l8_table(delta, times, dens, svn, s2, pn, tol=1e-7, p_tol=1e-6)  # (P printed to 6 digits)


# ---------------------------------------------------------------- (d) free fermions

def free_fermion_oracle(L, occ, J, t):
    """Densities, S_vN per bond and P(N_A) at bond L/2 of the XX chain from G(t) = U G(0) U^dagger."""
    h = np.zeros((L, L))
    for j in range(L - 1):
        h[j, j + 1] = h[j + 1, j] = J / 2
    w, v = np.linalg.eigh(h)
    U = (v * np.exp(-1j * w * t)) @ v.T
    G = U @ np.diag(np.array(occ, float)) @ U.conj().T
    n = G.diagonal().real
    svn = []
    for ell in range(1, L):
        nu = np.clip(np.linalg.eigvalsh(G[:ell, :ell]), 1e-300, 1 - 1e-16)
        svn.append(-np.sum(nu * np.log(nu) + (1 - nu) * np.log(1 - nu)))
    ell = L // 2
    GA = G[:ell, :ell]
    chi = [np.linalg.det(np.eye(ell) - GA + np.exp(2j * np.pi * m / (ell + 1)) * GA) for m in range(ell + 1)]
    P = [sum(chi[m] * np.exp(-2j * np.pi * m * k / (ell + 1)) for m in range(ell + 1)).real / (ell + 1)
         for k in range(ell + 1)]
    return n, np.array(svn), np.array(P)


@pytest.mark.parametrize("state,occ", [("neel", [1, 0] * 20), ("domain_wall", [1] * 20 + [0] * 20)])
def test_xx_chain_matches_free_fermions(tmp, state, occ):
    # dt = 0.02: the Trotter error is about 5e-6 here (Neel), well inside 1e-4
    L, dt, steps = 40, 0.02, 200
    r, out = run_steps(tmp, init_step(f"{{L: {L}, state: {state}}}") +
                       tebd_step(f"{{J: 1, delta: 0, dt: {dt}, steps: {steps}, measure_every: 50, "
                                 "trunc: {chi_max: 128, svd_min: 1.0e-10}}"))
    assert r.code == 0, r
    times, dens, svn, pn, eps = read(out / "evo.h5", "times", "density", "entropy_vN", "charge_distribution",
                                     "truncation_error")
    for i, t in enumerate(times):
        n, s, P = free_fermion_oracle(L, occ, 1.0, t)
        np.testing.assert_allclose(dens[i], n, rtol=0, atol=1e-4)
        np.testing.assert_allclose(svn[i], s, rtol=0, atol=1e-4)
        np.testing.assert_allclose(pn[i][:L // 2 + 1], P, rtol=0, atol=1e-4)
        assert np.all(pn[i][L // 2 + 1:] < 1e-12)
    np.testing.assert_allclose(times, [0, 1, 2, 3, 4], rtol=0, atol=1e-12)
    assert svn[-1].max() > 0.5  # the evolution built real entanglement (Neel 1.9, domain wall 0.7)
    assert eps[-1] < 1e-6


def test_long_xx_chain_matches_the_readme_values(tmp):
    """L = 200 Neel (odd 1-based sites occupied) at t = 1: the README's n_100, n_101 (1-based)."""
    r, out = run_steps(tmp, init_step("{L: 200, state: neel}") +
                       tebd_step("{dt: 0.1, steps: 10, order: 4, measure_every: 10, "
                                 "trunc: {chi_max: 64, svd_min: 1.0e-10}}"))
    assert r.code == 0, r
    times, dens, chi = read(out / "evo.h5", "times", "density", "chi")
    np.testing.assert_allclose(times, [0, 1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(dens[1, 99:101], [0.388054610429, 0.611945389571], rtol=0, atol=1e-6)
    np.testing.assert_allclose(dens.sum(axis=1), 100, rtol=0, atol=1e-9)
    assert 1 < chi.max() <= 64


# ---------------------------------------------------------------- (e) truncation

def test_small_chi_max_truncates_and_reports_the_discarded_weight(tmp):
    r, out = run_steps(tmp, init_step("{L: 16, state: neel}") +
                       tebd_step("{delta: 0.5, dt: 0.05, steps: 40, measure_every: 10, trunc: {chi_max: 8}}"))
    assert r.code == 0, r
    chi, eps, norm, lam, off = read(out / "evo.h5", "chi", "truncation_error", "norm", "lambda", "bond_offsets")
    assert chi.max() == 8 and (chi <= 8).all()
    assert eps[-1] > 1e-8 and (np.diff(eps) >= 0).all()
    for k in range(1, 16):
        assert abs(np.sum(lam[off[k]:off[k + 1]] ** 2) - 1) < 1e-12
    # the same run untruncated differs by about the discarded weight, and has none
    r2, out2 = run_steps(tmp / "full", init_step("{L: 16, state: neel}") +
                         tebd_step("{delta: 0.5, dt: 0.05, steps: 40, measure_every: 10, trunc: {chi_max: 256}}"))
    assert r2.code == 0, r2
    chi2, eps2, dens2 = read(out2 / "evo.h5", "chi", "truncation_error", "density")
    assert chi2.max() > 8 and eps2[-1] < 1e-20
    dens = read(out / "evo.h5", "density")[0]
    assert 0 < np.abs(dens - dens2).max() < 10 * np.sqrt(eps[-1])


def with_record(m):
    """The state with bond 0's index (the total N of a mixed boundary) kept as a leg left of site
    0, shape (N's, d, ..., d): its Schmidt values are what the MPS's lambda are (docs/mps.md)."""
    psi = np.diag(np.asarray(m["bonds"][0][1], complex))
    for Bj in m["B"]:
        psi = np.einsum("pa,ajb->pjb", psi, Bj).reshape(-1, Bj.shape[2])
    return psi.reshape([-1] + [m["d"]] * m["L"])


def schmidt_with_record(psi, k):
    s = np.linalg.svd(psi.reshape(psi.shape[0] * psi.shape[1] ** k, -1), compute_uv=False)
    return s[s > 1e-15]


def best_cut(psi, k, chi):
    """The weight the best rank-chi approximation at bond k alone discards (normalised)."""
    p = schmidt_with_record(psi, k) ** 2
    p = np.sort(p / p.sum())[::-1]
    return p[chi:].sum()


@pytest.mark.parametrize("params,chi_max", [
    ("L: 8, d: 2, state: random, total_charge: 4, chi: 16, seed: 3", 4),
    ("L: 4, d: 5, state: squeezed, squeezing: 0.6", 3),  # a mixed boundary: bond 0 is cut as well
])
def test_mps_init_compresses_to_chi_max_with_an_honest_error(tmp, params, chi_max):
    r, out = run_steps(tmp, init_step("{" + params + "}", "exact") +
                       init_step("{" + params + f", trunc: {{chi_max: {chi_max}}}" + "}", "cut") +
                       init_step("{" + params + ", trunc: {chi_max: 10000}}", "uncut") +
                       tebd_step(f"{{model: bose_hubbard, J: 1, U: 1, dt: 0.05, steps: 1, trunc: {{chi_max: {chi_max}}}}}", state="cut"))
    assert r.code == 0, r
    exact, cut = load_mps(out / "exact.h5"), load_mps(out / "cut.h5")
    psi, phi = with_record(exact), with_record(cut)
    if psi.shape[0] != phi.shape[0]:  # totals dropped from bond 0: align the records by N
        full = np.zeros_like(psi)
        rows = {c: i for i, c in enumerate(exact["bonds"][0][0])}
        for i, c in enumerate(cut["bonds"][0][0]):
            full[rows[c]] = phi[i]
        phi = full
    with h5py.File(out / "cut.h5") as f:
        eps = float(f.attrs["truncation_error"])
    assert all(len(c) <= chi_max for c, _ in cut["bonds"])
    assert max(len(c) for c, _ in exact["bonds"]) > chi_max
    # a normalised, right-canonical state whose lambda are its own Schmidt values
    assert abs(np.linalg.norm(phi) - 1) < 1e-12
    for Bj in cut["B"]:
        g = np.einsum("ajb,cjb->ac", Bj, Bj.conj())
        assert np.abs(g - np.eye(len(g))).max() < 1e-12
    for k in range(1, cut["L"]):
        np.testing.assert_allclose(np.sort(cut["bonds"][k][1])[::-1], schmidt_with_record(phi, k), rtol=0, atol=1e-12)
    # the error it reports bounds the infidelity, and no single cut can do better than it
    infidelity = 1 - abs(np.vdot(psi, phi)) ** 2
    assert eps > 1e-4
    assert infidelity <= eps * (1 + 1e-9) + 1e-13
    assert eps >= max(best_cut(psi, k, chi_max) for k in range(1, cut["L"])) - 1e-13
    # nothing to cut: the same state, no error
    uncut = with_record(load_mps(out / "uncut.h5"))
    assert np.abs(uncut - psi).max() < 1e-12
    with h5py.File(out / "uncut.h5") as f:
        assert float(f.attrs["truncation_error"]) < 1e-20
    # mps.tebd's accumulated error starts from the input's
    assert read(out / "evo.h5", "truncation_error")[0][0] == eps


@pytest.mark.parametrize("threads", [2, 4])
def test_device_budgets_below_the_in_core_peak_give_the_same_bits(tmp, threads):
    """Out of core: the updates running at once share the device budget, each lent what its
    estimate asks (a fair part of what is free, at least what its largest charge block needs);
    an update larger than its share goes in groups of centre charges (C and Vh parked in host
    memory between the passes), one that does not fit waits for the others, and one that cannot
    run beside any other runs alone after them. The bits do not change and the peak stays within
    the budget. A budget below one block is a bad input (exit 2)."""
    steps = (init_step("{L: 16, d: 2, state: random, total_charge: 8, chi: 32, seed: 3}") +
             tebd_step("{J: 1, delta: 0.5, dt: 0.05, steps: 4, trunc: {chi_max: 64}}"))
    env = {"OMP_NUM_THREADS": str(threads)}
    r, out = run_steps(tmp / "free", steps, env=env)
    assert r.code == 0, r
    with h5py.File(out / "evo.h5") as f:
        peak = int(f.attrs["qstage.peak_device_bytes"])
        free = {k: f[k][()].tobytes() for k in f if isinstance(f[k], h5py.Dataset)}
    spec = write_spec(tmp / "tight.yaml", f"name: tight\nsteps:\n{steps}")
    # (on cuda each stream's cuBLAS workspace, 8 MiB, backend/cuda_backend.cu, comes off the
    # budget before the updates' shares: the fractions are of the rest)
    streams = threads * (8 << 20) if DEVICE == "cuda" else 0
    for fraction, tight_budget in [(0.7, False), (0.2, True)]:
        budget = streams + int(fraction * (peak - streams))
        tight = run(["run", spec, "--run-dir", tmp / f"run-{fraction}", "--device", DEVICE, "--device-memory", str(budget)], env=env)
        assert tight.code == 0, tight
        log = (tmp / f"run-{fraction}" / "logs" / "rank-0.log").read_text()
        grouped = re.search(r"[0-9]+ updates larger than their device share went in groups of centre charges \([0-9]+ groups", log)
        # (on cuda fewer updaters, each holding a stream's workspace, may leave the updates whole)
        assert grouped or (tight_budget and DEVICE == "cuda")
        if tight_budget:  # (some update went in groups, waited or ran alone: the budget constrained)
            shared = re.search(r"within the device budget at most ([0-9]+) updates ran at once on ([0-9]+) threads \(([0-9]+) waited", log)
            assert shared, log
            assert 1 <= int(shared.group(1)) <= threads and int(shared.group(2)) == threads
        with h5py.File(tmp / f"run-{fraction}" / "outputs" / "evo.h5") as f:
            assert {k: f[k][()].tobytes() for k in f if isinstance(f[k], h5py.Dataset)} == free
            assert int(f.attrs["qstage.peak_device_bytes"]) <= budget
    small = run(["run", spec, "--run-dir", tmp / "run-small", "--device", DEVICE, "--device-memory", "1000"], env=env)
    one_line_error(small, "too small for one two-site update", "--device-memory")
    if DEVICE == "cpu":  # (the block that does not fit the whole budget, not one of a share halved to nothing)
        assert re.search(r"one charge block of [0-9]+ x [0-9]+ needs about .*, the update's share is 1000 B;", small.err), small.err


# ---------------------------------------------------------------- (f) bad input

@pytest.mark.parametrize("params,fragments", [
    ("{L: 3, state: fock, occupations: [0, 2, 1]}", ["'occupations'[1] is 2", "[0, 1]"]),
    ("{L: 3, state: fock, occupations: [0, 1]}", ["'occupations' has 2 entries", "L = 3"]),
    ("{L: 4, state: random, total_charge: 5}", ["'total_charge' is 5", "L (d-1) = 4"]),
    ("{L: 4, state: neel, total_charge: 2}", ["'total_charge' is for state 'random'"]),
    ("{L: 4, state: domain_wall, filled: 5}", ["'filled' is 5"]),
])
def test_bad_init_parameters_exit_2(tmp, params, fragments):
    r, _ = run_steps(tmp, init_step(params))
    one_line_error(r, *fragments)


def test_bad_tebd_inputs_exit_2(tmp):
    r, _ = run_steps(tmp / "chi", init_step("{L: 4, state: neel}") + tebd_step("{dt: 0.1, steps: 2, trunc: {chi_max: 0}}"))
    one_line_error(r, "chi_max")
    r, _ = run_steps(tmp / "d3", init_step("{L: 4, d: 3, state: neel}") + tebd_step("{dt: 0.1, steps: 2}"))
    one_line_error(r, "d = 3", "expected 2")
    r, _ = run_steps(tmp / "notmps", "  - id: psi\n    stage: tensor.random\n    params: {shape: [4, 4], dtype: complex128, seed: 1}\n"
                     + tebd_step("{dt: 0.1, steps: 2}"))
    one_line_error(r, "is not an MPS")


@pytest.mark.parametrize("init,params,fragments", [
    # dt = 1e16 ended with norm 1.86 and exit 0; at 1e20 the gates were NaN, and LAPACK's failure on
    # them escaped an OpenMP region: SIGABRT and a backtrace.
    ("{L: 6, state: neel}", "{dt: 1.0e16, steps: 2}",
     ["with dt = 1e+16 (J = 1, delta = 0, h = 0), the XXZ gate of bond (0, 1) is not unitary in double precision",
      "expected at most 1e-10: a smaller 'dt' or smaller couplings"]),
    ("{L: 6, state: neel}", "{dt: 1.0e20, steps: 2}", ["max |U^dagger U - 1| = nan"]),
    ("{L: 6, state: neel}", "{J: 1.0e20, h: 3, dt: 0.1, steps: 2}", ["(J = 1e+20, delta = 0, h = 3)"]),
    ("{L: 4, d: 3, state: fock, occupations: [1, 1, 1, 1]}", "{model: bose_hubbard, U: 1.0e18, dt: 0.1, steps: 2}",
     ["(J = 1, U = 1e+18, mu = 0), the Bose-Hubbard gate of bond (0, 1) is not unitary"]),
    ("{L: 4, d: 3, state: fock, occupations: [1, 1, 0, 0]}",
     "{model: interferometer, beam_splitters: [{mode: 0, theta: 1.0e20}]}",
     ["with theta = 1e+20, the beam splitter on modes (0, 1) is not unitary", "a smaller 'theta'"]),
])
def test_gates_that_are_not_unitary_in_floating_point_are_refused(tmp, init, params, fragments):
    r, _ = run_steps(tmp, init_step(init) + tebd_step(params))
    one_line_error(r, *fragments)


def test_output_layouts_match_their_schemas(tmp):
    jsonschema = pytest.importorskip("jsonschema")
    import json
    from conftest import ROOT
    r, out = run_steps(tmp, init_step("{L: 6, state: neel}") + tebd_step("{dt: 0.1, steps: 3}"))
    assert r.code == 0, r
    for step, stage in (("psi", "mps.init"), ("evo", "mps.tebd")):
        r = run(["inspect", out / f"{step}.h5", "--json"])
        assert r.code == 0, r
        schema = json.loads((ROOT / "schemas" / "outputs" / f"{stage}.json").read_text())
        jsonschema.validate(json.loads(r.out), schema)
        # the schema is strict enough to notice a missing dataset
        layout = json.loads(r.out)
        layout["datasets"] = [d for d in layout["datasets"] if d["path"] != "/lambda"]
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(layout, schema)
