"""Which state sci.solve finds (docs/selected-ci.md, "Which state"): the FCIDUMP's ISYM and MS2
unless the `irrep`, `ms2` or `occupation` parameters say otherwise, on FCIDUMPs whose orbitals are
ordered by irrep as Psi4 and Molpro write them. The oracle is PySCF's FCI with symmetry
(direct_spin1_symm) on the same integrals.

C2/STO-3G at 1.25 Angstrom is the multireference case: its lowest-diagonal determinant (a B2u or
B3u one) is not of the ground state's irrep (Ag), and sci.solve grown from it used to converge to
the lowest B2u state, 48 mHa above the ground state, saying nothing."""
import numpy as np
import pytest

from conftest import DEVICE, one_line_error, run
from test_sci_solve import DATA, pyscf_or_skip, result, sci_spec, solve

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
        pyscf_id = {v: k for k, v in MOLPRO_D2H.items()}[label]
        solver = self.fci.direct_spin1_symm.FCI(self.mol)
        solver.wfnsym = pyscf_id
        solver.conv_tol = 1e-12
        e, _ = solver.kernel(self.h1, self.eri, self.mo.shape[1], nelec, ecore=self.mol.energy_nuc(),
                             orbsym=self.orbsym)
        return e


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
