"""Which state sci.solve finds (docs/selected-ci.md, "Which state"): the FCIDUMP's ISYM and MS2
unless the `irrep`, `ms2` or `occupation` parameters say otherwise, on FCIDUMPs whose orbitals are
ordered by irrep as Psi4 and Molpro write them. The oracle is PySCF's FCI with symmetry
(direct_spin1_symm) on the same integrals, for the lowest state and for several (`nroots`).

C2/STO-3G at 1.25 Angstrom is the multireference case: its lowest-diagonal determinant (a B2u or
B3u one) is not of the ground state's irrep (Ag), and sci.solve grown from it used to converge to
the lowest B2u state, 48 mHa above the ground state, saying nothing."""
import h5py
import numpy as np
import pytest

from conftest import DEVICE, one_line_error, run
from test_sci_solve import DATA, SMALL_BATCHES, digests, killed_and_resumed, pyscf_or_skip, result, sci_spec, solve

FULL = "eps_var: 1.0e-12, eps_pt2: 1.0e-12, max_new_dets: 1000000, energy_tolerance: 1.0e-10, davidson_tolerance: 1.0e-8"
MOLPRO_D2H = {0: 1, 7: 2, 6: 3, 1: 4, 5: 5, 2: 6, 3: 7, 4: 8}  # PySCF's D2h irrep ids -> the FCIDUMP's labels


class C2ByIrrep:
    """C2/STO-3G's RHF orbitals ordered by irrep (energy order within one), as an FCIDUMP, and
    PySCF's FCI of any irrep and spin on the same integrals."""

    def __init__(self, tmp):
        gto, scf, fci, fcidump = pyscf_or_skip()
        from pyscf import ao2mo, symm
        self.mol = gto.M(atom="C 0 0 0; C 0 0 1.25", basis="sto-3g", symmetry="D2h", verbose=0)
        assert self.mol.groupname == "D2h"
        mf = scf.RHF(self.mol).run()
        orbsym = np.asarray(symm.label_orb_symm(self.mol, self.mol.irrep_id, self.mol.symm_orb, mf.mo_coeff))
        order = np.argsort(orbsym, kind="stable")
        self.mo, self.orbsym = mf.mo_coeff[:, order], orbsym[order]
        assert list(order) != list(range(len(order)))  # (the file's order is not the energy order)
        self.path = tmp / "c2_irrep.fcidump"
        fcidump.from_mo(self.mol, str(self.path), self.mo, orbsym=[MOLPRO_D2H[int(g)] for g in self.orbsym])
        self.h1 = self.mo.T @ mf.get_hcore() @ self.mo
        self.eri = ao2mo.kernel(self.mol, self.mo)
        self.fci = fci
        self.rhf_occupied = [int(p) for p in np.nonzero(mf.mo_occ[order] > 0)[0]]

    def energy(self, label, nelec=(6, 6)):
        """The lowest FCI energy of the FCIDUMP label `label` with (alpha, beta) electrons."""
        return self.states(label, 1, nelec)[0][0]

    def states(self, label, nroots, nelec=(6, 6)):
        """The lowest `nroots` FCI energies of label `label` (any spin) and their <S^2>."""
        pyscf_id = {v: k for k, v in MOLPRO_D2H.items()}[label]
        solver = self.fci.direct_spin1_symm.FCI(self.mol)
        solver.wfnsym = pyscf_id
        solver.conv_tol = 1e-12
        solver.nroots = nroots
        e, v = solver.kernel(self.h1, self.eri, self.mo.shape[1], nelec, ecore=self.mol.energy_nuc(),
                             orbsym=self.orbsym)
        e, v = np.atleast_1d(e), (v if nroots > 1 else [v])
        return e, [self.fci.spin_op.spin_square0(x, self.mo.shape[1], nelec)[0] for x in v]


@pytest.fixture(scope="module")
def c2(tmp_path_factory):
    return C2ByIrrep(tmp_path_factory.mktemp("c2"))


class ActiveSpaceByIrrep:
    """A molecule's RHF orbitals, an active space of `ncas` orbitals with `nelecas` electrons
    (the core frozen, as CASCI does), the active orbitals ordered by irrep as an FCIDUMP (the
    core's energy in the core line), and PySCF's FCI on it (CASCI) in the totally symmetric irrep."""

    def __init__(self, tmp, atom, basis, ncas, nelecas):
        gto, scf, fci, fcidump = pyscf_or_skip()
        from pyscf import ao2mo, mcscf, symm
        mol = gto.M(atom=atom, basis=basis, symmetry="D2h", verbose=0)
        assert mol.groupname == "D2h"
        mf = scf.RHF(mol).run()
        assert mf.converged
        cas = mcscf.CASCI(mf, ncas, nelecas)
        window = slice(cas.ncore, cas.ncore + ncas)
        orbsym = np.asarray(symm.label_orb_symm(mol, mol.irrep_id, mol.symm_orb, mf.mo_coeff))[window]
        order = np.argsort(orbsym, kind="stable")
        assert list(order) != list(range(ncas))  # (the file's order is not the energy order)
        mo = mf.mo_coeff.copy()
        mo[:, window] = mf.mo_coeff[:, window][:, order]
        self.orbsym = orbsym[order]
        h1, ecore = cas.get_h1eff(mo)
        eri = ao2mo.restore(1, cas.get_h2eff(mo), ncas)
        self.path = tmp / "active.fcidump"
        fcidump.from_integrals(str(self.path), h1, eri, ncas, nelecas, ecore,
                               orbsym=[MOLPRO_D2H[int(g)] for g in self.orbsym])
        solver = fci.direct_spin1_symm.FCI(mol)
        solver.wfnsym, solver.conv_tol = 0, 1e-12
        self.energy, _ = solver.kernel(h1, eri, ncas, (nelecas // 2, nelecas // 2), ecore=ecore, orbsym=self.orbsym)


@pytest.mark.parametrize("name, atom, ncas, nelecas", [
    # N2 stretched to 2.2 Angstrom (STO-3G, 10 orbitals, 14 electrons: FCI), where RHF is far from
    # the state; Cr2 at 1.5 Angstrom (seed 004's geometry) in STO-3G, its 3d and 4s orbitals and
    # 12 electrons active (CASCI, 107,000 determinants of irrep Ag): the multireference classic.
    ("stretched-n2", "N 0 0 0; N 0 0 2.2", 10, 14),
    ("cr2", "Cr 0 0 0; Cr 0 0 1.5", 12, 12),
])
def test_multireference_fcidumps_ordered_by_irrep_give_pyscfs_lowest_state(name, atom, ncas, nelecas, tmp):
    m = ActiveSpaceByIrrep(tmp, atom, "sto-3g", ncas, nelecas)
    r = result(solve(tmp / name, m.path, FULL))
    assert abs(r["energy"] - m.energy) < 1e-6, (name, r["energy"], m.energy)
    assert (r["attrs"]["irrep"], r["attrs"]["irrep_from"]) == (1, "ISYM")
    assert abs(r["attrs"]["s_squared"]) < 1e-4  # (both ground states are singlets)


def test_the_lowest_state_of_isym_on_an_fcidump_ordered_by_irrep(c2, tmp):
    want = c2.energy(1)
    assert want < c2.energy(3) - 0.04  # (the state it used to find instead)
    run_dir = solve(tmp, c2.path, FULL)
    r = result(run_dir)
    assert abs(r["energy"] - want) < 1e-6, (r["energy"], want)
    a = r["attrs"]
    assert (a["irrep"], a["irrep_from"], a["ms2"]) == (1, "ISYM", 0)
    assert abs(a["s_squared"]) < 1e-6
    # the lower determinant of another irrep is named, in the output and in the log
    assert "irrep" in a["warning"] and "lower diagonal" in a["warning"], a["warning"]
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "a lower determinant is of irrep" in log and "set 'irrep'" in log
    assert len(a["leading_determinants"].splitlines()) == 5
    assert "alpha" in a["reference_determinant"] and "beta" in a["reference_determinant"]
    # every determinant of the space is of the target irrep
    labels = [MOLPRO_D2H[int(g)] - 1 for g in c2.orbsym]
    for alpha, beta in r["dets"][:2000]:
        g = 0
        for p, label in enumerate(labels):
            g ^= label * (((int(alpha) >> p) & 1) ^ ((int(beta) >> p) & 1))
        assert g == 0


@pytest.mark.parametrize("label", [3, 5])
def test_an_irrep_asked_for_gives_pyscfs_state_of_that_irrep(c2, label, tmp):
    r = result(solve(tmp, c2.path, FULL + f", irrep: {label}"))
    want = c2.energy(label)
    assert abs(r["energy"] - want) < 1e-6, (label, r["energy"], want)
    assert (r["attrs"]["irrep"], r["attrs"]["irrep_from"]) == (label, "parameter irrep")
    assert abs(r["attrs"]["s_squared"] - 2) < 1e-4  # (both are triplets)


def test_ms2_asks_for_another_spin(c2, tmp):
    r = result(solve(tmp, c2.path, FULL + ", ms2: 2"))
    want = c2.energy(1, nelec=(7, 5))
    assert abs(r["energy"] - want) < 1e-6, (r["energy"], want)
    assert r["attrs"]["ms2"] == 2 and r["attrs"]["s_squared"] > 1.99


def test_an_occupation_gives_the_state_of_its_irrep(c2, tmp):
    """Dice's numbering: spin orbital 2p is orbital p's alpha, 2p + 1 its beta. The RHF
    determinant (Ag), and one with an alpha electron moved into another irrep."""
    rhf = [2 * p for p in c2.rhf_occupied] + [2 * p + 1 for p in c2.rhf_occupied]
    r = result(solve(tmp / "rhf", c2.path, FULL + f", occupation: {sorted(rhf)}"))
    assert abs(r["energy"] - c2.energy(1)) < 1e-6
    assert (r["attrs"]["irrep"], r["attrs"]["irrep_from"]) == (1, "occupation")
    # alpha from the highest occupied orbital to the lowest empty one of another irrep
    labels = [MOLPRO_D2H[int(g)] for g in c2.orbsym]
    top = max(c2.rhf_occupied)  # (any occupied orbital does)
    empty = next(p for p in range(len(labels)) if p not in c2.rhf_occupied and labels[p] != labels[top])
    moved = sorted([2 * p for p in c2.rhf_occupied if p != top] + [2 * empty] + [2 * p + 1 for p in c2.rhf_occupied])
    label = 1 + ((labels[top] - 1) ^ (labels[empty] - 1))
    r = result(solve(tmp / "moved", c2.path, FULL + f", occupation: {moved}"))
    assert r["attrs"]["irrep"] == label
    assert abs(r["energy"] - c2.energy(label)) < 1e-6, (label, r["energy"], c2.energy(label))


def test_bad_state_parameters_exit_2_with_one_line(c2, tmp):
    cases = [
        (DATA / "H2H2_FCIDUMP_nosym", "irrep: 2", "parameter 'irrep' is 2, which no determinant has",
         "expected one of them"),
        (c2.path, "occupation: [0, 1, 2, 3]", "parameter 'occupation' has 2 alpha and 2 beta electrons",
         "expected 6 and 6"),
        (c2.path, "occupation: [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", "parameter 'occupation' lists spin orbital 0 twice",
         None),
        (c2.path, "occupation: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 40]", "parameter 'occupation' has spin orbital 40",
         "expected 0 to 19"),
        (c2.path, "ms2: 1", "parameter 'ms2' is 1", "NELEC + MS2 even"),
    ]
    for i, (fcidump, params, what, expected) in enumerate(cases):
        r = run(["run", sci_spec(tmp, fcidump, params), "--run-dir", tmp / f"run{i}", "--device", DEVICE])
        one_line_error(r, what, *([expected] if expected else []))
    # an occupation of another irrep than the one asked for
    rhf = [2 * p for p in c2.rhf_occupied] + [2 * p + 1 for p in c2.rhf_occupied]
    r = run(["run", sci_spec(tmp, c2.path, f"irrep: 5, occupation: {sorted(rhf)}"), "--run-dir", tmp / "run-x",
             "--device", DEVICE])
    one_line_error(r, "parameter 'occupation' is a determinant of irrep 1, parameter 'irrep' asks for 5")


def test_a_file_without_symmetry_is_one_irrep(tmp):
    """N2/STO-6G (ORBSYM all 1): every determinant is of irrep 1, and nothing is said of others."""
    r = result(solve(tmp, DATA / "N2_sto6g_FCIDUMP", "eps_var: 2.0e-3, eps_pt2: 1.0e-7, max_new_dets: 600"))
    assert (r["attrs"]["irrep"], r["attrs"]["irrep_from"]) == (1, "ISYM")
    assert "warning" not in r["attrs"]
    assert abs(r["attrs"]["s_squared"]) < 1e-3


# ---------------------------------------------------------------- several roots

def roots_of(run_dir):
    with h5py.File(run_dir / "outputs" / "sci.h5") as f:
        return {k: f["roots"][k][()] for k in f["roots"]} | {
            "coefficients_attrs": dict(f["roots/coefficients"].attrs), "nroots": f.attrs["nroots"],
            "e_var_roots": f["iterations/e_var_roots"][()]}


@pytest.mark.parametrize("label", [1, 3])
def test_several_roots_are_pyscfs_lowest_states_of_the_irrep(c2, label, tmp):
    """nroots = 5 in Ag (the ground state, two singlets, two quintets) and in B1g (a triplet first),
    on the FCIDUMP ordered by irrep, with a threshold that admits the whole irrep: PySCF's five
    lowest energies of that irrep and their <S^2>; the scalar outputs are the lowest root's."""
    want, want_s2 = c2.states(label, 5)
    run_dir = solve(tmp, c2.path, FULL + f", nroots: 5, irrep: {label}")
    r, roots = result(run_dir), roots_of(run_dir)
    np.testing.assert_allclose(roots["energy"], want, atol=1e-6, rtol=0)
    np.testing.assert_allclose(roots["s_squared"], want_s2, atol=1e-4)
    c = roots["coefficients"]
    assert c.shape == (5, len(r["dets"]))
    np.testing.assert_allclose(c @ c.T, np.eye(5), atol=1e-9)
    assert r["energy"] == roots["energy"][0] and r["coefficients"].tobytes() == c[0].tobytes()
    assert r["e_total"] == roots["e_total"][0] and roots["nroots"] == 5
    assert all(len(roots["coefficients_attrs"][f"leading_determinants_{i}"].splitlines()) == 5 for i in range(5))
    # (the first iteration's space is one determinant: one root there)
    assert np.isfinite(roots["e_var_roots"][0, 0]) and np.isnan(roots["e_var_roots"][0, 1:]).all()


def n2_fci_states(nroots):
    _, _, fci, fcidump = pyscf_or_skip()
    d = fcidump.read(str(DATA / "N2_sto6g_FCIDUMP"), verbose=False)
    solver = fci.direct_spin1.FCI()
    solver.nroots, solver.conv_tol = nroots, 1e-12
    e, _ = solver.kernel(d["H1"], d["H2"], d["NORB"], d["NELEC"], ecore=d["ECORE"])
    return np.asarray(e)


N2_ROOTS = "nroots: 3, eps_var: 1.0e-3, eps_pt2: 1.0e-7, max_new_dets: 600"


def test_several_roots_at_a_threshold_each_with_its_pt2(tmp):
    """N2/STO-6G's three lowest states (a singlet, two triplets) at eps_var 1e-3: each E_var above
    its FCI energy, each E_var + E_PT2 within 20 uHa of it; a semistochastic PT2 per root agrees
    with the deterministic one within 4 error bars."""
    fci_roots = n2_fci_states(3)
    det = roots_of(solve(tmp / "det", DATA / "N2_sto6g_FCIDUMP", N2_ROOTS))
    assert (det["energy"] > fci_roots - 1e-9).all(), (det["energy"], fci_roots)
    np.testing.assert_allclose(det["e_total"], fci_roots, atol=2e-5, rtol=0)
    np.testing.assert_allclose(det["s_squared"], [0, 2, 2], atol=1e-3)
    semi = roots_of(solve(tmp / "semi", DATA / "N2_sto6g_FCIDUMP", N2_ROOTS + ", eps_pt2_large: 1.0e-4, "
                          "pt2_samples: 400, pt2_batches: 60, pt2_target_error: 0, pt2_seed: 4"))
    assert semi["energy"].tobytes() == det["energy"].tobytes()
    assert (semi["e_pt2_error"] > 0).all()
    assert (abs(semi["e_pt2"] - det["e_pt2"]) < 4 * semi["e_pt2_error"]).all(), (semi["e_pt2"], det["e_pt2"], semi["e_pt2_error"])


N2_ROOTS_LONG = ("nroots: 2, eps_var: [2.0e-3, 1.0e-3], eps_pt2: 1.0e-7, max_new_dets: 600, eps_pt2_large: 1.0e-4, "
                 "pt2_samples: 400, pt2_batches: 60, pt2_target_error: 0, pt2_seed: 5")


def test_several_roots_give_the_same_bits_on_three_ranks_and_after_kills(tmp):
    """Two roots over a schedule with a semistochastic PT2 each: three ranks, and SIGKILLs at
    random instants (in any root's passes) each resumed, give the bytes of one clean run; each
    root is extrapolated over the schedule."""
    clean_run = solve(tmp / "clean", DATA / "N2_sto6g_FCIDUMP", N2_ROOTS_LONG)
    clean = digests(clean_run)
    with h5py.File(clean_run / "outputs" / "sci.h5") as f:
        assert f["schedule/e_var_roots"].shape == (2, 2) and f["schedule/e_pt2_roots"].shape == (2, 2)
        assert np.isfinite(f["roots/e_extrapolated"][()]).all()
        assert f["roots/e_extrapolated"][0] == f.attrs["e_extrapolated"]
    three = solve(tmp / "three", DATA / "N2_sto6g_FCIDUMP", N2_ROOTS_LONG, SMALL_BATCHES, mpi=3)
    assert digests(three) == clean
    kills, killed = killed_and_resumed(tmp, N2_ROOTS_LONG, 6, clean_run, 20261204)
    assert kills >= 2
    assert killed == clean


@pytest.mark.parametrize("nroots", [0, 17])
def test_a_bad_nroots_exits_2_with_one_line(nroots, tmp):
    spec = sci_spec(tmp, DATA / "N2_sto6g_FCIDUMP", f"eps_var: 2.0e-3, nroots: {nroots}")
    one_line_error(run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE]), "nroots")


def test_more_roots_than_determinants_says_how_many_it_found(tmp):
    """A space capped at 4 determinants (max_dets) holds 4 states: 8 roots asked for give those 4,
    orthonormal, and the log and the result line say so."""
    run_dir = solve(tmp, DATA / "H2H2_FCIDUMP_nosym", "eps_var: 1.0e-6, nroots: 8, max_dets: 4")
    roots = roots_of(run_dir)
    assert roots["energy"].shape == (4,) and roots["nroots"] == 8
    assert (np.diff(roots["energy"]) >= 0).all()
    np.testing.assert_allclose(roots["coefficients"] @ roots["coefficients"].T, np.eye(4), atol=1e-9)
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "the space has 4 determinants: 4 of nroots = 8 roots found" in log
    assert "4 of nroots = 8" in log.split("result:")[-1]
