"""Photon loss (docs/mps.md, seed 001's lossy GBS): mps.init's lossy squeezed inputs as density
matrices (charge_kind n_pair) and mps.tebd's interferometer acting on them as U rho U^dagger,
against numpy density matrices in the Fock basis: the pure-loss channel sum_k K_k rho K_k^dagger
applied to the pure squeezed state, the same circuit of cut beam splitters applied to rho, and loss
applied after the interferometer instead of before (uniform loss commutes with it). numpy only."""
import math

import h5py
import numpy as np
import pytest

from conftest import one_line_error
from test_mps import init_step, load_mps, read, run_steps, state_vector, tebd_step
from test_mps_bosons import apply_two_site, beam_splitter_fock, interferometer_step, squeezed_mode

SHIFT = 15


# ---------------------------------------------------------------- numpy oracles

def loss_channel(rho, eta):
    """sum_k K_k rho K_k^dagger, K_k = sqrt((1-eta)^k / k!) eta^{n/2} a^k, on one mode's matrix."""
    d = rho.shape[0]
    a = np.diag(np.sqrt(np.arange(1, d)), 1)
    eta_n = np.diag(eta ** (np.arange(d) / 2))
    out = np.zeros_like(rho)
    ak = np.eye(d)
    for k in range(d):
        K = math.sqrt((1 - eta) ** k / math.factorial(k)) * eta_n @ ak
        out += K @ rho @ K.conj().T
        ak = a @ ak
    return out


def lossy_squeezed(r, phase, eta, d, big=160):
    """The loss channel on the pure squeezed vacuum cut at `big` photons (far above d), then cut at d."""
    a = squeezed_mode(r, phase, big)
    return loss_channel(np.outer(a, a.conj()), eta)[:d, :d]


def mode_loss(rho, eta, j, L, d):
    """The loss channel on mode j of an L-mode density matrix (d^L x d^L)."""
    t = rho.reshape([d] * (2 * L))
    a = np.diag(np.sqrt(np.arange(1, d)), 1)
    out = np.zeros_like(t)
    ak = np.eye(d)
    for k in range(d):
        K = math.sqrt((1 - eta) ** k / math.factorial(k)) * np.diag(eta ** (np.arange(d) / 2)) @ ak
        x = np.moveaxis(np.tensordot(K, t, axes=(1, j)), 0, j)
        x = np.moveaxis(np.tensordot(K.conj(), x, axes=(1, L + j)), 0, L + j)
        out += x
        ak = a @ ak
    return out.reshape(d ** L, d ** L)


def apply_gate_rho(rho, g, j, L, d):
    """G rho G^dagger with the two-site d^2 x d^2 gate g on modes j, j+1."""
    t = rho.reshape([d] * (2 * L))
    t = np.moveaxis(t, [j, j + 1], [0, 1])
    shape = t.shape
    t = (g @ t.reshape(d * d, -1)).reshape(shape)
    t = np.moveaxis(t, [0, 1], [j, j + 1])
    t = np.moveaxis(t, [L + j, L + j + 1], [0, 1])
    shape = t.shape
    t = (g.conj() @ t.reshape(d * d, -1)).reshape(shape)
    t = np.moveaxis(t, [0, 1], [L + j, L + j + 1])
    return t.reshape(d ** L, d ** L)


def load_rho(path):
    """The density matrix an n_pair output holds: weight times the vectorised MPS (docs/mps.md's
    snippet with d^2 local values, n_ket d + n_bra), as a d^L x d^L matrix; and its bond keys."""
    with h5py.File(path) as f:
        assert f.attrs["charge_kind"] == "n_pair" and int(f.attrs["pair_shift"]) == SHIFT
        L, d, w = int(f.attrs["L"]), int(f.attrs["d"]), float(f.attrs["weight"])
        off, charges, lam = f["bond_offsets"][()], f["bond_charges"][()], f["lambda"][()]
        blocks, boff, values = f["blocks"][()], f["block_offsets"][()], f["values"][()]
    chi = np.diff(off)
    B = [np.zeros((chi[j], d * d, chi[j + 1]), complex) for j in range(L)]
    for b, (j, cl, cr, r0, c0, rows, cols) in enumerate(blocks):
        nk, nb = (cl >> SHIFT) - (cr >> SHIFT), (cl & (2 ** SHIFT - 1)) - (cr & (2 ** SHIFT - 1))
        assert 0 <= nk < d and 0 <= nb < d  # the block rule, per component
        B[j][r0:r0 + rows, nk * d + nb, c0:c0 + cols] = values[boff[b]:boff[b + 1]].reshape(rows, cols)
    vec = lam[off[0]:off[1]].astype(complex).reshape(1, -1)
    for Bj in B:
        vec = np.einsum("pa,ajb->pjb", vec, Bj).reshape(-1, Bj.shape[2])
    t = vec.reshape([d, d] * L)
    t = t.transpose(list(range(0, 2 * L, 2)) + list(range(1, 2 * L, 2)))
    keys = [charges[off[k]:off[k + 1]] for k in range(L + 1)]
    return w * t.reshape(d ** L, d ** L), keys


def occupations_rho(rho, L, d):
    p = np.real(np.diag(rho)).reshape([d] * L) / np.trace(rho).real
    return np.array([np.tensordot(p.sum(axis=tuple(i for i in range(L) if i != j)), np.arange(d), 1) for j in range(L)])


def total_distribution(rho, L, d):
    p = np.real(np.diag(rho)).reshape([d] * L) / np.trace(rho).real
    out = np.zeros(L * (d - 1) + 1)
    for idx in np.ndindex(*p.shape):
        out[sum(idx)] += p[idx]
    return out


def left_distribution_rho(rho, L, d, k):
    p = np.real(np.diag(rho)).reshape([d] * L) / np.trace(rho).real
    out = np.zeros(L * (d - 1) + 1)
    for idx in np.ndindex(*p.shape):
        out[sum(idx[:k])] += p[idx]
    return out


def lossy_input(r, eta, d):
    """The product of the modes' lossy squeezed states, each normalised inside the cut; and the cut loss."""
    rho, kept = np.ones((1, 1)), 1.0
    for rj in r:
        m = lossy_squeezed(rj, 0.0, eta, d)
        kept *= np.trace(m).real
        rho = np.kron(rho, m / np.trace(m))
    return rho, 1 - kept


# ---------------------------------------------------------------- checks of the oracles themselves

def test_the_loss_channel_oracle_keeps_the_trace_and_scales_the_mean():
    a = squeezed_mode(0.7, 0.3, 120)
    out = loss_channel(np.outer(a, a.conj()), 0.45)
    assert abs(np.trace(out) - 1) < 1e-12
    assert abs(np.real(np.diag(out)) @ np.arange(120) - 0.45 * np.sinh(0.7) ** 2) < 1e-12
    np.testing.assert_allclose(out, out.conj().T, atol=1e-15)


# ---------------------------------------------------------------- single mode

@pytest.mark.parametrize("rr,eta,phase", [(0.8, 0.45, 0.0), (0.5, 0.9, 1.1)])
def test_single_mode_lossy_squeezed_state(tmp, rr, eta, phase):
    """rho against the loss channel on the pure state (1e-13), its trace 1 inside the cut with the
    cut's loss in the attribute cut_loss, P(n) in total_charge_distribution, <n> = eta sinh^2 r."""
    d = 41
    r, out = run_steps(tmp, init_step(f"{{L: 1, d: {d}, state: squeezed, squeezing: {rr}, squeezing_phase: {phase}, eta: {eta}}}"))
    assert r.code == 0, r
    rho, keys = load_rho(out / "psi.h5")
    want = lossy_squeezed(rr, phase, eta, d)
    cut = float(h5py.File(out / "psi.h5").attrs["cut_loss"])
    assert abs(cut - (1 - np.trace(want).real)) < 1e-14
    np.testing.assert_allclose(rho, want / np.trace(want), rtol=0, atol=1e-13)
    assert abs(np.trace(rho) - 1) < 1e-13
    # odd and even photon numbers do not mix: every pair key on bond 0 has N_ket - N_bra even
    assert all(((k >> SHIFT) - (k & (2 ** SHIFT - 1))) % 2 == 0 for k in keys[0])
    pn = read(out / "psi.h5", "total_charge_distribution")[0]
    np.testing.assert_allclose(pn, np.real(np.diag(want)) / np.trace(want).real, rtol=0, atol=1e-13)
    assert (pn[1::2] > 1e-6).any()  # loss makes odd photon numbers
    assert abs(pn @ np.arange(d) * (1 - cut) - eta * np.sinh(rr) ** 2) < 1e-9


def test_eta_one_as_a_density_matrix_is_the_pure_state(tmp):
    r, out = run_steps(tmp, init_step("{L: 2, d: 7, state: squeezed, squeezing: [0.4, 0.6], density_matrix: true}") +
                       init_step("{L: 2, d: 7, state: squeezed, squeezing: [0.4, 0.6]}", id="pure"))
    assert r.code == 0, r
    rho, _ = load_rho(out / "psi.h5")
    psi = state_vector(load_mps(out / "pure.h5")).reshape(-1)
    np.testing.assert_allclose(rho, np.outer(psi, psi.conj()), rtol=0, atol=1e-13)


# ---------------------------------------------------------------- lossy GBS

@pytest.mark.parametrize("L,d,r,eta,seed", [(3, 6, [0.5, 0.4, 0.0], 0.55, 5), (4, 4, [0.6, 0.5, 0.4, 0.3], 0.45, 2)])
def test_lossy_gbs_matches_a_density_matrix_simulation(tmp, L, d, r, eta, seed):
    """Squeezed inputs, loss, a Haar interferometer of cut beam splitters: the whole rho (1e-11),
    <n_i>, P(N), P(N_left), Tr rho = 1 - cut_loss and pattern probabilities diag(rho) against
    numpy's U rho U^dagger of the same gates; the pair charges of bond 0 are kept."""
    r_, out = run_steps(tmp, init_step(f"{{L: {L}, d: {d}, state: squeezed, squeezing: {r}, eta: {eta}}}") +
                        interferometer_step(haar_seed=seed, extra=", measure_every: 2"))
    assert r_.code == 0, r_
    rho0, keys0 = load_rho(out / "psi.h5")
    want0, lost0 = lossy_input(r, eta, d)
    np.testing.assert_allclose(rho0, want0, rtol=0, atol=1e-13)
    assert abs(float(h5py.File(out / "psi.h5").attrs["cut_loss"]) - lost0) < 1e-14
    circuit, dens, pn, pl, norm, cut, eps = read(out / "evo.h5", "beam_splitters", "density", "total_charge_distribution",
                                                  "charge_distribution", "norm", "cut_loss", "truncation_error")
    rho = want0
    for row in circuit:
        rho = apply_gate_rho(rho, beam_splitter_fock(d, *row[1:]), int(row[0]), L, d)
    got, keys = load_rho(out / "evo.h5")
    assert eps[-1] < 1e-20
    np.testing.assert_allclose(got, rho, rtol=0, atol=1e-11)
    tr = np.trace(rho).real
    assert 1e-6 < 1 - tr  # the cut does take something here, and it is reported
    np.testing.assert_allclose([norm[-1], cut[-1]], [tr, 1 - tr], rtol=0, atol=1e-12)
    np.testing.assert_allclose(dens[-1], occupations_rho(rho, L, d), rtol=0, atol=1e-11)
    width = pn.shape[1]
    np.testing.assert_allclose(pn[-1], total_distribution(rho, L, d)[:width], rtol=0, atol=1e-12)
    np.testing.assert_allclose(pl[-1], left_distribution_rho(rho, L, d, L // 2)[:width], rtol=0, atol=1e-12)
    p = np.real(np.diag(rho)) / tr
    g = np.real(np.diag(got)) / np.trace(got).real
    for pattern in [(0,) * L, (1,) + (0,) * (L - 1), (1, 1) + (0,) * (L - 2), (2,) + (0,) * (L - 2) + (1,)]:
        i = np.ravel_multi_index(pattern, [d] * L)
        assert abs(g[i] - p[i]) < 1e-12 and p[i] > 1e-4, pattern
    # the pair charges: bond 0 keeps its (N_ket, N_bra) totals, N_ket - N_bra even
    assert set(keys[0].tolist()) <= set(keys0[0].tolist())
    assert all(((k >> SHIFT) - (k & (2 ** SHIFT - 1))) % 2 == 0 for k in keys[0])


def test_loss_commutes_with_the_interferometer(tmp):
    """Loss on the inputs (the MPS) = loss on the outputs (numpy: the pure state through the same
    circuit, then the channel on every output mode), and <n_i> = sum_j |U_ij|^2 eta sinh^2 r_j: the
    two orders differ only by what lies above the Fock cut (the interferometer's cut_loss, mps.init's,
    and the pure inputs' weight above d - 1 that numpy's order drops before the loss; together
    about 1e-7 here): the occupations agree to 10 times that; rho's entries, where an amplitude
    above the cut meets one below it, to its square root (Cauchy-Schwarz)."""
    L, d, r, eta = 3, 12, [0.3, 0.2, 0.25], 0.6
    r_, out = run_steps(tmp, init_step(f"{{L: {L}, d: {d}, state: squeezed, squeezing: {r}, eta: {eta}}}") +
                        interferometer_step(haar_seed=9, extra=", measure_every: 3"))
    assert r_.code == 0, r_
    U, circuit, dens, cut = read(out / "evo.h5", "unitary", "beam_splitters", "density", "cut_loss")
    init_cut = float(h5py.File(out / "psi.h5").attrs["cut_loss"])
    pure_cut = 1 - np.prod([np.sum(np.abs(squeezed_mode(rj, 0.0, d)) ** 2) for rj in r])
    tol = 10 * (cut[-1] + init_cut + pure_cut)
    assert 0 < cut[-1] < 1e-6 and tol < 1e-5
    psi = np.ones(1, complex)
    for rj in r:
        psi = np.kron(psi, squeezed_mode(rj, 0.0, d))
    psi = psi.reshape([d] * L)
    for row in circuit:
        psi = apply_two_site(psi, beam_splitter_fock(d, *row[1:]), int(row[0]))
    v = psi.reshape(-1)
    rho = np.outer(v, v.conj())
    for j in range(L):
        rho = mode_loss(rho, eta, j, L, d)
    got, _ = load_rho(out / "evo.h5")
    np.testing.assert_allclose(dens[-1], np.abs(U) ** 2 @ (eta * np.sinh(r) ** 2), rtol=0, atol=tol)
    np.testing.assert_allclose(occupations_rho(rho, L, d), dens[-1], rtol=0, atol=tol)
    np.testing.assert_allclose(got / np.trace(got), rho / np.trace(rho), rtol=0, atol=np.sqrt(tol))
    assert np.abs(dens[-1] - dens[0]).max() > 0.01  # the interferometer did move photons


def test_a_truncated_lossy_interferometer_reports_its_error(tmp):
    """chi_max well below the exact bond dimension: a positive truncation error, chi <= chi_max. The
    cut is in the Frobenius norm of the vectorised rho, so it moves the trace too (norm = Tr rho
    reports it) and the trace observables by more than eps (docs/mps.md)."""
    spec = "{L: 3, d: 5, state: squeezed, squeezing: 0.6, eta: 0.5}"
    r1, exact = run_steps(tmp / "a", init_step(spec) + interferometer_step(haar_seed=1))
    r2, cut = run_steps(tmp / "b", init_step(spec) + tebd_step("{model: interferometer, haar_seed: 1, trunc: {chi_max: 12}}"))
    assert r1.code == 0 and r2.code == 0, (r1, r2)
    chi_exact, eps_exact, norm_exact = read(exact / "evo.h5", "chi", "truncation_error", "norm")
    chi, eps, norm = read(cut / "evo.h5", "chi", "truncation_error", "norm")
    assert eps_exact[-1] < 1e-20 and chi_exact[-1].max() > 12
    assert chi[-1].max() <= 12 and eps[-1] > 1e-8
    assert abs(norm[-1] - norm_exact[-1]) > 1e-6


def test_mps_init_compresses_a_lossy_input_to_chi_max(tmp):
    """seed 001's Table I starts from lossy squeezed inputs whose exact bonds (bond 0's pairs
    (N_ket, N_bra) included) are far above chi_max: mps.init's trunc cuts them on the Schmidt
    values of the vectorised rho, the error bounds the Frobenius infidelity, and the weight keeps
    rho = weight * (the state)."""
    spec = "L: 4, d: 4, state: squeezed, squeezing: [0.8, 0.8, 0.8, 0], eta: 0.45"
    r, out = run_steps(tmp, init_step("{" + spec + "}", "exact") + init_step("{" + spec + ", trunc: {chi_max: 6}}", "cut"))
    assert r.code == 0, r
    rho, keys = load_rho(out / "exact.h5")
    sigma, cut_keys = load_rho(out / "cut.h5")
    with h5py.File(out / "cut.h5") as f:
        eps, w = float(f.attrs["truncation_error"]), float(f.attrs["weight"])
    assert max(len(k) for k in keys) > 6 and max(len(k) for k in cut_keys) <= 6
    v, u = rho.ravel(), sigma.ravel()
    infidelity = 1 - abs(np.vdot(v, u)) ** 2 / (np.vdot(v, v).real * np.vdot(u, u).real)
    assert 1e-6 < eps and infidelity <= eps * (1 + 1e-9) + 1e-13
    # the weight holds what the cut took: |sigma|_F = |rho|_F (1 - what the cuts discarded)^(1/2) at most
    assert np.linalg.norm(u) <= np.linalg.norm(v) * (1 + 1e-12)
    assert abs(np.trace(sigma).real - 1) < 10 * np.sqrt(eps)
    np.testing.assert_allclose(sigma, sigma.conj().T, atol=1e-12)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("params,fragments", [
    ("{L: 3, d: 5, state: squeezed, squeezing: 0.5, eta: 0}", ["'eta' is 0", "0 < eta <= 1"]),
    ("{L: 3, d: 5, state: squeezed, squeezing: 0.5, eta: 1.5}", ["'eta' is 1.5", "0 < eta <= 1"]),
    ("{L: 3, d: 5, state: squeezed, squeezing: 0.5, eta: -0.2}", ["'eta' is -0.2"]),
    ("{L: 3, d: 5, state: neel, eta: 0.5}", ["'eta' is for state 'squeezed'"]),
    ("{L: 3, d: 5, state: fock, occupations: [1, 0, 1], density_matrix: true}", ["'density_matrix' is for state 'squeezed'"]),
    ("{L: 600, d: 64, state: squeezed, squeezing: 0.1, eta: 0.5}", ["37800 photons", "at most 32767"]),
])
def test_bad_loss_inputs_exit_2(tmp, params, fragments):
    r, _ = run_steps(tmp, init_step(params))
    one_line_error(r, *fragments)


def test_a_density_matrix_needs_an_interferometer(tmp):
    r, _ = run_steps(tmp, init_step("{L: 3, d: 4, state: squeezed, squeezing: 0.3, eta: 0.5}") +
                     tebd_step("{model: bose_hubbard, J: 1, U: 1, dt: 0.1, steps: 1}"))
    one_line_error(r, "density matrix", "n_pair", "model 'interferometer'")


def test_the_lossy_gbs_example_workflow_runs(tmp):
    """workflows/mps-lossy-gbs.yaml: <n_i> = sum_j |U_ij|^2 eta sinh^2 r_j up to its Fock cut and
    truncation (measured 7.5e-4; docs/mps.md), norm = Tr rho = 1 - cut_loss."""
    from conftest import ROOT, run
    r = run(["run", ROOT / "workflows" / "mps-lossy-gbs.yaml", "--run-dir", tmp / "run", "--device", "cpu"])
    assert r.code == 0, r
    U, dens, norm, cut, eps = read(tmp / "run" / "outputs" / "gbs.h5", "unitary", "density", "norm", "cut_loss", "truncation_error")
    assert cut[-1] < 1e-3 and eps[-1] < 1e-5
    np.testing.assert_allclose(norm, 1 - cut, rtol=0, atol=1e-15)
    np.testing.assert_allclose(dens[-1], np.abs(U) ** 2 @ (0.45 * np.sinh([0.5] * 5 + [0]) ** 2), rtol=0, atol=2e-3)


def test_a_stopped_lossy_run_resumes_with_the_same_bits(tmp):
    """SIGTERM after a committed beam splitter, then `qstage resume`: the checkpoint carries the
    charge kind and the weight, and the outputs are the uninterrupted run's bits."""
    import re
    from conftest import DEVICE, run, write_spec
    from test_mps_resume import digests, log, stop_when_committed
    text = ("name: lossy\nsteps:\n" + init_step("{L: 5, d: 6, state: squeezed, squeezing: [0.5, 0.4, 0.5, 0.3, 0], eta: 0.5}") +
            tebd_step("{model: interferometer, haar_seed: 3, checkpoint_every: 1, trunc: {chi_max: 1024}}"))
    tmp.mkdir(parents=True, exist_ok=True)
    s = write_spec(tmp / "lossy.yaml", text)
    r = run(["run", s, "--run-dir", tmp / "clean", "--device", DEVICE])
    assert r.code == 0, r
    code, err = stop_when_committed(["run", s, "--run-dir", tmp / "run", "--device", DEVICE], tmp / "run", 0.0)
    if code == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert code == 75, err
    r = run(["resume", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    assert re.search(r"mps.tebd: resuming after beam splitter \d+ of 10", log(tmp / "run"))
    assert digests(tmp / "run") == digests(tmp / "clean")
