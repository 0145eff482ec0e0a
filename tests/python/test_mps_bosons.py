"""Bosons and lossless linear optics in mps.init and mps.tebd (docs/mps.md): the Bose-Hubbard
chain against a numpy state vector of the same Trotter circuit, beam splitters (Hong-Ou-Mandel,
a Haar-random interferometer's occupations and photon-number distribution), squeezed-vacuum
inputs with the total photon number on bond 0 (a mixed boundary), and a small Gaussian boson
sampler against hafnians and a Fock-space simulation of the same circuit. numpy only."""
import math
from itertools import product

import numpy as np
import pytest

from conftest import one_line_error
from test_mps import init_step, load_mps, read, run_steps, state_vector, tebd_step


def read_attr(path, name):
    import h5py
    with h5py.File(path) as f:
        return f.attrs[name]


# ---------------------------------------------------------------- numpy oracles

def apply_two_site(psi, g, j):
    """The d^2 x d^2 gate g (index n_l d + n_r) on sites j, j+1 of the state vector psi."""
    d = psi.shape[0]
    psi = np.moveaxis(psi, [j, j + 1], [0, 1])
    shape = psi.shape
    psi = (g @ psi.reshape(d * d, -1)).reshape(shape)
    return np.moveaxis(psi, [0, 1], [j, j + 1])


def expm_hermitian(h, tau):
    w, v = np.linalg.eigh(h)
    return (v * np.exp(-1j * tau * w)) @ v.conj().T


def bose_hubbard_term(d, J, U, mu, wl, wr):
    """-J (b+_l b_r + h.c.) + wl (U/2 n_l(n_l-1) - mu n_l) + wr (...), index n_l d + n_r."""
    b = np.diag(np.sqrt(np.arange(1, d)), 1)  # annihilation, cut at d
    n = np.diag(np.arange(d, dtype=float))
    one = np.eye(d)
    onsite = U / 2 * n @ (n - one) - mu * n
    return -J * (np.kron(b.T, b) + np.kron(b, b.T)) + wl * np.kron(onsite, one) + wr * np.kron(one, onsite)


def bose_hubbard_circuit(psi, J, U, mu, dt, steps, order):
    """mps.tebd's Trotter circuit (docs/mps.md: Strang steps of weights w, the on-site terms half
    per bond and whole at the ends); yields psi after every step."""
    L, d = psi.ndim, psi.shape[0]
    def term(j):
        return bose_hubbard_term(d, J, U, mu, 1.0 if j == 0 else 0.5, 1.0 if j + 1 == L - 1 else 0.5)
    a = 1 / (4 - 4 ** (1 / 3))
    for _ in range(steps):
        for w in ([1.0] if order == 2 else [a, a, 1 - 4 * a, a, a]):
            for parity, tau in ((0, w * dt / 2), (1, w * dt), (0, w * dt / 2)):
                for j in range(parity, L - 1, 2):
                    psi = apply_two_site(psi, expm_hermitian(term(j), tau), j)
        yield psi


def energy(psi, terms):
    return sum(np.vdot(psi, apply_two_site(psi, t, j)).real for j, t in enumerate(terms))


def occupations(psi):
    prob = np.abs(psi) ** 2
    return np.array([np.tensordot(prob.sum(axis=tuple(i for i in range(psi.ndim) if i != j)), np.arange(psi.shape[0]), 1)
                     for j in range(psi.ndim)])


def left_distribution(psi, k, width):
    """P(n particles on sites 0..k-1), n = 0..width-1; what lies beyond width must be (numerically) 0."""
    out = np.zeros(psi.ndim * (psi.shape[0] - 1) + 1)
    for idx in np.ndindex(*psi.shape):
        out[sum(idx[:k])] += abs(psi[idx]) ** 2
    assert out[width:].sum() < 1e-24
    return out[:width]


def purified_entropies(psi, k):
    """S_vN and S_2 of bond k for the state with its total N recorded on a leg left of site 0
    (docs/mps.md: the entropies of a mixed boundary)."""
    L, d = psi.ndim, psi.shape[0]
    aux = np.zeros((L * (d - 1) + 1,) + psi.shape, complex)
    for idx in np.ndindex(*psi.shape):
        aux[(sum(idx),) + idx] = psi[idx]
    s = np.linalg.svd(aux.reshape(aux.shape[0] * d ** k, -1), compute_uv=False)
    p = s[s > 1e-15] ** 2
    return -np.sum(p * np.log(p)), -np.log(np.sum(p ** 2))


def mode_matrix(theta, phi, pl, pr):
    """docs/mps.md's beam splitter: a+_j -> sum_i u_ij a+_i."""
    c, s = np.cos(theta), np.sin(theta)
    return np.array([[c, -1j * np.exp(1j * phi) * s], [-1j * np.exp(-1j * phi) * s, c]]) @ np.diag(np.exp([1j * pl, 1j * pr]))


def interferometer_unitary(M, circuit):
    U = np.eye(M, dtype=complex)
    for mode, theta, phi, pl, pr in circuit:
        m = int(mode)
        U[[m, m + 1], :] = mode_matrix(theta, phi, pl, pr) @ U[[m, m + 1], :]
    return U


def beam_splitter_fock(d, theta, phi, pl, pr):
    """exp(-i theta (e^{i phi} a+ b + h.c.)) exp(i pl n_a + i pr n_b), each pair total's block
    exact and then cut at d (amplitude leaving the cut is lost)."""
    g = np.zeros((d * d, d * d), complex)
    for n in range(2 * d - 1):
        h = np.zeros((n + 1, n + 1), complex)
        for k in range(n):
            h[k + 1, k] = theta * np.sqrt((k + 1) * (n - k)) * np.exp(1j * phi)
            h[k, k + 1] = np.conj(h[k + 1, k])
        u = expm_hermitian(h, 1.0)
        for l in range(max(0, n - d + 1), min(n, d - 1) + 1):
            for k in range(max(0, n - d + 1), min(n, d - 1) + 1):
                g[l * d + n - l, k * d + n - k] = u[l, k] * np.exp(1j * (pl * k + pr * (n - k)))
    return g


def squeezed_mode(r, phase, d):
    a = np.zeros(d, complex)
    for n in range(0, (d + 1) // 2):
        a[2 * n] = (-np.exp(1j * phase) * np.tanh(r)) ** n * math.sqrt(math.factorial(2 * n)) / (2 ** n * math.factorial(n))
    return a / np.sqrt(np.cosh(r))


def hafnian(A):
    """Sum over the perfect matchings of A's indices: pair index 0 with each j, recurse on the rest."""
    n = A.shape[0]
    if n == 0:
        return 1.0 + 0j
    if n % 2:
        return 0j
    rest = np.arange(1, n)
    total = 0j
    for i, j in enumerate(rest):
        keep = np.delete(rest, i)
        total += A[0, j] * hafnian(A[np.ix_(keep, keep)])
    return total


def gbs_probability(U, r, phase, pattern):
    """Pure-state GBS: P(n) = |Haf(A_n)|^2 / (prod n_i! prod cosh r_j), A = U diag(e^{i phase} tanh r) U^T."""
    A = U @ np.diag(np.exp(1j * np.asarray(phase)) * np.tanh(r)) @ U.T
    idx = [i for i, n in enumerate(pattern) for _ in range(n)]
    return abs(hafnian(A[np.ix_(idx, idx)])) ** 2 / (np.prod([math.factorial(n) for n in pattern]) * np.prod(np.cosh(r)))


# ---------------------------------------------------------------- checks of the oracles themselves

def test_the_hafnian_counts_perfect_matchings():
    assert hafnian(np.ones((6, 6))) == 15  # 5!!
    A = np.arange(16.0).reshape(4, 4)
    A = A + A.T
    assert hafnian(A) == A[0, 1] * A[2, 3] + A[0, 2] * A[1, 3] + A[0, 3] * A[1, 2]


# ---------------------------------------------------------------- Bose-Hubbard

@pytest.mark.parametrize("init,order", [
    ("{L: 5, d: 3, state: fock, occupations: [2, 0, 1, 2, 0]}", 2),
    ("{L: 5, d: 3, state: fock, occupations: [2, 0, 1, 2, 0]}", 4),
    ("{L: 4, d: 4, state: squeezed, squeezing: [0.6, 0, 0.4, 0.0], squeezing_phase: [0, 0, 1.1, 0]}", 2),
])
def test_bose_hubbard_matches_the_same_trotter_circuit_as_a_state_vector(tmp, init, order):
    J, U, mu, dt, steps = 0.9, 2.3, 0.4, 0.05, 12
    r, out = run_steps(tmp, init_step(init) +
                       tebd_step(f"{{model: bose_hubbard, J: {J}, U: {U}, mu: {mu}, dt: {dt}, steps: {steps}, order: {order}, "
                                 "trunc: {chi_max: 256}}"))
    assert r.code == 0, r
    psi0 = state_vector(load_mps(out / "psi.h5"))
    L, d = psi0.ndim, psi0.shape[0]
    terms = [bose_hubbard_term(d, J, U, mu, 1.0 if j == 0 else 0.5, 1.0 if j + 1 == L - 1 else 0.5) for j in range(L - 1)]
    times, dens, svn, s2, pn, norm, en, chi = read(out / "evo.h5", "times", "density", "entropy_vN", "entropy_2",
                                                   "charge_distribution", "norm", "energy", "chi")
    N = int(read_attr(out / "evo.h5", "total_charge"))
    states = [psi0] + list(bose_hubbard_circuit(psi0, J, U, mu, dt, steps, order))
    for t, psi in enumerate(states):
        assert abs(times[t] - t * dt) < 1e-14
        np.testing.assert_allclose(dens[t], occupations(psi), rtol=0, atol=1e-10)
        np.testing.assert_allclose(pn[t], left_distribution(psi, L // 2, N + 1), rtol=0, atol=1e-10)
        assert abs(en[t] - energy(psi, terms)) < 1e-10, t
        assert abs(norm[t] - 1) < 1e-10
        for k in range(1, L):
            e_vn, e_2 = purified_entropies(psi, k)
            assert abs(svn[t, k - 1] - e_vn) < 1e-10 and abs(s2[t, k - 1] - e_2) < 1e-10, (t, k)
    assert chi.max() > 1
    final = state_vector(load_mps(out / "evo.h5"))
    assert abs(abs(np.vdot(final, states[-1])) - 1) < 1e-10


def test_bose_hubbard_energy_of_a_fock_state_is_its_onsite_energy(tmp):
    # <2,0,1,3|H|2,0,1,3> = sum_j U/2 n(n-1) - mu n: hopping has no diagonal
    r, out = run_steps(tmp, init_step("{L: 4, d: 4, state: fock, occupations: [2, 0, 1, 3]}") +
                       tebd_step("{model: bose_hubbard, U: 1.5, mu: 0.25, dt: 0.1, steps: 1}"))
    assert r.code == 0, r
    n = np.array([2, 0, 1, 3])
    expected = np.sum(1.5 / 2 * n * (n - 1) - 0.25 * n)
    en = read(out / "evo.h5", "energy")[0]
    assert abs(en[0] - expected) < 1e-13


# ---------------------------------------------------------------- beam splitters

def interferometer_step(bs=None, haar_seed=None, extra=""):
    what = f"haar_seed: {haar_seed}" if haar_seed is not None else f"beam_splitters: {bs}"
    return tebd_step(f"{{model: interferometer, {what}, trunc: {{chi_max: 1024}}{extra}}}")


@pytest.mark.parametrize("phi,expected", [
    (np.pi / 2, {(2, 0): 1 / np.sqrt(2), (0, 2): -1 / np.sqrt(2)}),
    (0.0, {(2, 0): -1j / np.sqrt(2), (0, 2): -1j / np.sqrt(2)}),
])
def test_hong_ou_mandel(tmp, phi, expected):
    """A 50:50 beam splitter on |1,1>: no coincidences. With phi = pi/2 it is the real rotation
    [[1, 1], [-1, 1]]/sqrt 2 and gives (|2,0> - |0,2>)/sqrt 2 exactly, global phase included."""
    r, out = run_steps(tmp, init_step("{L: 2, d: 3, state: fock, occupations: [1, 1]}") +
                       interferometer_step(f"[{{mode: 0, theta: {np.pi / 4!r}, phi: {phi!r}}}]"))
    assert r.code == 0, r
    psi = state_vector(load_mps(out / "evo.h5"))
    want = np.zeros((3, 3), complex)
    for idx, amp in expected.items():
        want[idx] = amp
    np.testing.assert_allclose(psi, want, rtol=0, atol=1e-14)
    times, dens, cut = read(out / "evo.h5", "times", "density", "cut_loss")
    np.testing.assert_array_equal(times, [0, 1])
    np.testing.assert_allclose(dens[1], [1, 1], rtol=0, atol=1e-14)
    assert cut[-1] == 0  # N = 2 <= d - 1: nothing can leave the cut


def test_a_haar_interferometer_moves_occupations_by_its_unitary(tmp):
    """Fock input with N = 4 <= d - 1 (exact, no cut): <n_i> = sum_j |U_ij|^2 <n_j>_in, and the state is
    the numpy Fock-space circuit of the written beam splitters, whose mode matrices give U."""
    n_in = [2, 0, 1, 1, 0]
    r, out = run_steps(tmp, init_step(f"{{L: 5, d: 5, state: fock, occupations: {n_in}}}") +
                       interferometer_step(haar_seed=3, extra=", measure_every: 4"))
    assert r.code == 0, r
    U, circuit, dens, times, cut, norm = read(out / "evo.h5", "unitary", "beam_splitters", "density", "times", "cut_loss", "norm")
    assert circuit.shape == (10, 5) and np.array_equal(times, [0, 4, 8, 10])
    np.testing.assert_allclose(U.conj().T @ U, np.eye(5), rtol=0, atol=1e-13)
    np.testing.assert_allclose(interferometer_unitary(5, circuit), U, rtol=0, atol=1e-12)
    assert np.abs(U).min() > 1e-3  # Haar: every mode reaches every other
    np.testing.assert_allclose(dens[-1], np.abs(U) ** 2 @ n_in, rtol=0, atol=1e-10)
    assert (cut == 0).all()
    np.testing.assert_allclose(norm, 1, rtol=0, atol=1e-12)
    psi = state_vector(load_mps(out / "psi.h5"))
    for row in circuit:
        psi = apply_two_site(psi, beam_splitter_fock(5, *row[1:]), int(row[0]))
    final = state_vector(load_mps(out / "evo.h5"))
    np.testing.assert_allclose(final, psi, rtol=0, atol=1e-10)
    # another seed, another unitary
    r2, out2 = run_steps(tmp / "other", init_step(f"{{L: 5, d: 5, state: fock, occupations: {n_in}}}") +
                         interferometer_step(haar_seed=4))
    assert r2.code == 0, r2
    assert np.abs(read(out2 / "evo.h5", "unitary")[0] - U).max() > 0.1


# ---------------------------------------------------------------- squeezed inputs

def test_single_mode_squeezed_vacuum_photon_statistics(tmp):
    """P(2n) = C(2n, n) 4^-n tanh^2n r / cosh r below the cut; the MPS is renormalised inside the
    cut, and the attribute cut_loss is the weight above it: P_mps (1 - cut_loss) is exact (1e-14)."""
    rr, d = 0.9, 21
    r, out = run_steps(tmp, init_step(f"{{L: 1, d: {d}, state: squeezed, squeezing: {rr}}}"))
    assert r.code == 0, r
    m = load_mps(out / "psi.h5")
    charges, lam = m["bonds"][0]
    assert charges.tolist() == list(range(0, d, 2))
    assert read_attr(out / "psi.h5", "boundary") == "mixed" and m["N"] == d - 1
    t = np.tanh(rr)
    exact = np.array([math.comb(2 * n, n) / 4 ** n * t ** (2 * n) / np.cosh(rr) for n in range(200)])
    cut = read_attr(out / "psi.h5", "cut_loss")
    assert abs(cut - exact[(d + 1) // 2:].sum()) < 1e-14 and cut > 1e-4
    pn = read(out / "psi.h5", "total_charge_distribution")[0]
    np.testing.assert_allclose(pn[::2] * (1 - cut), exact[:(d + 1) // 2], rtol=0, atol=1e-14)
    np.testing.assert_allclose(lam ** 2, pn[::2], rtol=0, atol=1e-15)
    assert (pn[1::2] == 0).all()
    # the state is the squeezed vacuum's amplitudes, phases included
    np.testing.assert_allclose(state_vector(m) * np.sqrt(1 - cut), squeezed_mode(rr, 0, d), rtol=0, atol=1e-14)


def test_four_identical_squeezers_give_the_readme_distribution(tmp):
    """M = 4, r = 0.8: P(0), P(2), P(4) of ../shared/data/mps/README.md to 1e-10 at d = 61, where the
    cut removes about 5e-12 (the cut_loss attribute says so); and P(N_left) at the centre bond is two
    squeezers' distribution, P(2n) = tanh^2n r / cosh^2 r."""
    r, out = run_steps(tmp, init_step("{L: 4, d: 61, state: squeezed, squeezing: 0.8}"))
    assert r.code == 0, r
    cut = read_attr(out / "psi.h5", "cut_loss")
    assert 0 < cut < 1e-10
    pn = read(out / "psi.h5", "total_charge_distribution")[0]
    assert pn.shape == (241,)
    np.testing.assert_allclose(pn[[0, 2, 4]], [0.312542680568, 0.275628159719, 0.182305218984], rtol=0, atol=1e-10)
    t2 = np.tanh(0.8) ** 2
    np.testing.assert_allclose(pn[:40:2], [math.comb(n + 1, n) * t2 ** n / np.cosh(0.8) ** 4 for n in range(20)],
                               rtol=0, atol=1e-10)


def test_a_mixed_boundary_measures_occupations_and_the_left_distribution(tmp):
    """Through mps.tebd (one identity beam splitter) with M = 4 squeezers cut at d = 21: the state is
    the product of the cut and renormalised modes, so <n_j> and P(N_left) at the centre bond (a
    convolution of two such modes) follow from the single-mode P(2n)."""
    rr, d = 0.8, 21
    r, out = run_steps(tmp, init_step(f"{{L: 4, d: {d}, state: squeezed, squeezing: {rr}}}") +
                       interferometer_step("[{mode: 0, theta: 0}]"))
    assert r.code == 0, r
    left, dens, totals, svn = read(out / "evo.h5", "charge_distribution", "density", "total_charge_distribution", "entropy_vN")
    assert left.shape == (2, 81) and totals.shape == (2, 81)
    mode = np.abs(squeezed_mode(rr, 0, d)) ** 2
    mode /= mode.sum()
    np.testing.assert_allclose(left[0], np.pad(np.convolve(mode, mode), (0, 40)), rtol=0, atol=1e-13)
    np.testing.assert_allclose(totals[0], np.convolve(np.convolve(mode, mode), np.convolve(mode, mode)), rtol=0, atol=1e-13)
    np.testing.assert_allclose(dens, mode @ np.arange(d), rtol=0, atol=1e-12)
    # the entropy of a mixed boundary is that of N_right's distribution (docs/mps.md), not 0
    p = np.convolve(mode, mode)
    p = p[p > 0]
    assert abs(svn[0, 1] - (-np.sum(p * np.log(p)))) < 1e-12


def test_an_interferometer_keeps_the_total_photon_distribution(tmp):
    """Squeezed inputs cut at d = 5: sectors N <= d - 1 never reach the cut, so their P(N) only
    rescales by the weight the gates lose above it (cut_loss): P_out(N) (1 - cut_loss) = P_in(N)."""
    r, out = run_steps(tmp, init_step("{L: 4, d: 5, state: squeezed, squeezing: [0.5, 0.3, 0.4, 0.2]}") +
                       interferometer_step(haar_seed=8))
    assert r.code == 0, r
    totals, cut, norm = read(out / "evo.h5", "total_charge_distribution", "cut_loss", "norm")
    assert cut[-1] > 1e-5 and (np.diff(cut) >= 0).all()
    np.testing.assert_allclose(totals[-1][:5] * (1 - cut[-1]), totals[0][:5], rtol=0, atol=1e-12)
    np.testing.assert_allclose(norm, 1, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- Gaussian boson sampling

def test_gaussian_boson_sampling_matches_hafnians(tmp):
    """M = 5 modes, four squeezed (with phases), a Haar interferometer, d = 7. Patterns with
    N <= d - 1 never touch the cut, so P_mps(n) (1 - cut_in)(1 - cut_gates) = |Haf(A_n)|^2 /
    (prod n! prod cosh r) to 1e-10; and the whole state is the numpy Fock-space circuit."""
    rs, phases, d, M = [0.5, 0.4, 0.0, 0.3, 0.45], [0.0, 0.7, 0.0, -1.2, 2.0], 7, 5
    r, out = run_steps(tmp, init_step(f"{{L: {M}, d: {d}, state: squeezed, squeezing: {rs}, squeezing_phase: {phases}}}") +
                       interferometer_step(haar_seed=21))
    assert r.code == 0, r
    U, circuit, cut = read(out / "evo.h5", "unitary", "beam_splitters", "cut_loss")
    cut_in = read_attr(out / "psi.h5", "cut_loss")
    assert cut_in > 0 and cut[-1] > 0
    psi = state_vector(load_mps(out / "evo.h5"))
    prob = np.abs(psi) ** 2 * (1 - cut_in) * (1 - cut[-1])
    checked = 0
    for pattern in product(range(d), repeat=M):
        if sum(pattern) <= d - 1:
            assert abs(prob[pattern] - gbs_probability(U, rs, phases, pattern)) < 1e-10, pattern
            checked += 1
    assert checked == math.comb(d - 1 + M, M)
    assert prob[(1, 1, 0, 1, 1)] > 1e-4  # the hafnian side is not trivially small
    # the Fock-space circuit, renormalised after each gate as the MPS is
    ref = np.ones((1,), complex)
    for rj, pj in zip(rs, phases):
        ref = np.multiply.outer(ref, squeezed_mode(rj, pj, d))
    ref = ref.reshape([d] * M) / np.linalg.norm(ref)
    for row in circuit:
        ref = apply_two_site(ref, beam_splitter_fock(d, *row[1:]), int(row[0]))
        ref /= np.linalg.norm(ref)
    np.testing.assert_allclose(psi, ref, rtol=0, atol=1e-10)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("init,params,fragments", [
    ("{L: 3, state: neel}", "{model: interferometer, haar_seed: 1, dt: 0.1}", ["'dt' is not for model 'interferometer'"]),
    ("{L: 3, state: neel}", "{model: interferometer, haar_seed: 1, beam_splitters: [{mode: 0, theta: 1}]}", ["exactly one of"]),
    ("{L: 3, state: neel}", "{model: interferometer}", ["exactly one of"]),
    ("{L: 3, state: neel}", "{model: interferometer, beam_splitters: [{mode: 2, theta: 1}]}", ["couples modes (2, 3)", "[0, 2]"]),
    ("{L: 3, state: neel}", "{model: interferometer, beam_splitters: [{mode: 0}]}", ["theta"]),
    ("{L: 3, state: neel}", "{model: interferometer, beam_splitters: [{mode: 0, theta: 1, angle: 2}]}", ["angle"]),
    ("{L: 1, d: 3, state: fock, occupations: [1]}", "{model: interferometer, haar_seed: 1}", ["at least 2 modes", "L = 1"]),
    ("{L: 3, state: neel}", "{model: xxz, U: 1, dt: 0.1, steps: 1}", ["'U' is not for model 'xxz'"]),
    ("{L: 3, state: neel}", "{model: bose_hubbard, U: 1}", ["model 'bose_hubbard' needs the parameters 'dt' and 'steps'"]),
    ("{L: 3, state: neel}", "{model: ising, dt: 0.1, steps: 1}", ["ising"]),
])
def test_bad_optics_and_model_parameters_exit_2(tmp, init, params, fragments):
    r, _ = run_steps(tmp, init_step(init) + tebd_step(params))
    one_line_error(r, *fragments)


@pytest.mark.parametrize("params,fragments", [
    ("{L: 3, d: 2, state: squeezed, squeezing: 0.5}", ["d = 2", "expected d >= 3"]),
    ("{L: 3, d: 5, state: squeezed, squeezing: [0.5, 0.2]}", ["'squeezing' has 2 entries", "L = 3"]),
    ("{L: 3, d: 5, state: squeezed, squeezing: 0.5, squeezing_phase: [0, 1]}", ["'squeezing_phase' has 2 entries"]),
    ("{L: 3, d: 5, state: squeezed}", ["needs the parameter 'squeezing'"]),
    ("{L: 3, d: 5, state: neel, squeezing: 0.5}", ["'squeezing' is for state 'squeezed'"]),
    ("{L: 3, d: 5, state: squeezed, squeezing: -0.5}", ["squeezing"]),
])
def test_bad_squeezed_inputs_exit_2(tmp, params, fragments):
    r, _ = run_steps(tmp, init_step(params))
    one_line_error(r, *fragments)


# ---------------------------------------------------------------- layouts and the example

def test_optics_output_layouts_match_their_schemas(tmp):
    jsonschema = pytest.importorskip("jsonschema")
    import json
    from conftest import ROOT, run
    r, out = run_steps(tmp, init_step("{L: 3, d: 5, state: squeezed, squeezing: [0.3, 0, 0.2]}") +
                       interferometer_step(haar_seed=2))
    assert r.code == 0, r
    for step, stage in (("psi", "mps.init"), ("evo", "mps.tebd")):
        r = run(["inspect", out / f"{step}.h5", "--json"])
        assert r.code == 0, r
        layout = json.loads(r.out)
        jsonschema.validate(layout, json.loads((ROOT / "schemas" / "outputs" / f"{stage}.json").read_text()))
        paths = {d["path"] for d in layout["datasets"]}
        assert "/total_charge_distribution" in paths, step
        assert "/energy" not in paths  # an interferometer has no Hamiltonian
    assert read_attr(out / "evo.h5", "boundary") == "mixed"


def test_the_gbs_example_workflow_runs(tmp):
    """workflows/mps-gbs.yaml: its output occupations are sum_j |U_ij|^2 sinh^2 r_j up to the Fock cut
    (its cut_loss, below 1e-4, and mps.init's) and no truncation to speak of."""
    from conftest import ROOT, run
    r = run(["run", ROOT / "workflows" / "mps-gbs.yaml", "--run-dir", tmp / "run", "--device", "cpu"])
    assert r.code == 0, r
    U, dens, cut, eps = read(tmp / "run" / "outputs" / "gbs.h5", "unitary", "density", "cut_loss", "truncation_error")
    assert cut[-1] < 1e-4 and eps[-1] < 1e-10
    np.testing.assert_allclose(dens[-1], np.abs(U) ** 2 @ (np.sinh([0.5] * 4 + [0, 0]) ** 2), rtol=0, atol=1e-3)
