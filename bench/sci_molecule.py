#!/usr/bin/env python3
"""Writes the FCIDUMP of a benchmark molecule (PySCF RHF, frozen core through CASCI's effective
integrals) and, with --fci, its exact energy from PySCF's FCI on those very integrals: the
reference bench/sci_bench.py measures time to 1 mHa against. Molecules with a point group get
ORBSYM (Molpro's D2h labels) and their orbitals in energy order.

cr2-sv is seed 004's large case: Cr2 at 1.5 Angstrom in Ahlrichs' SV basis (Schafer, Horn and
Ahlrichs, J. Chem. Phys. 97, 2571 (1992); [5s2p2d] per atom, from the Basis Set Exchange's
"Ahlrichs VDZ"), all 48 electrons in 42 orbitals: 84 qubits.

    python3 bench/sci_molecule.py h2o-ccpvdz-fc --out H2O_ccpvdz_fc_FCIDUMP --fci [--threads 16]

Prints one JSON object (molecule, orbitals, electrons, determinants, FCI energy and seconds).
"""
import argparse
import json
import math
import time

CR_SV = """
Cr    S
  51528.086349  0.14405823106E-02
  7737.2103487  0.11036202287E-01
  1760.3748470  0.54676651806E-01
  496.87706544  0.18965038103
  161.46520598  0.38295412850
  55.466352268  0.29090050668
Cr    S
  107.54732999  -0.10932281100
  12.408671897  0.64472599471
  5.0423628826  0.46262712560
Cr    S
  8.5461640165  -0.22711013286
  1.3900441221  0.73301527591
  0.56066602876  0.44225565433
Cr    S
  0.71483705972E-01  1.0000000000
Cr    S
  0.28250687604E-01  1.0000000000
Cr    P
  640.48536096  0.96126715203E-02
  150.69711194  0.70889834655E-01
  47.503755296  0.27065258990
  16.934120165  0.52437343414
  6.2409680590  0.34107994714
Cr    P
  3.0885463206  0.33973986903
  1.1791047769  0.57272062927
  0.43369774432  0.24582728206
Cr    D
  27.559479426  0.30612488044E-01
  7.4687020327  0.15593270944
  2.4345903574  0.36984421276
  0.78244754808  0.47071118077
Cr    D
  0.21995774311  0.33941649889
"""
MOLPRO_D2H = {0: 1, 7: 2, 6: 3, 1: 4, 5: 5, 2: 6, 3: 7, 4: 8}  # PySCF's D2h irrep ids -> the FCIDUMP's labels
SYMMETRIC = {"cr2-sv": "D2h"}

MOLECULES = {
    # name: (atoms in Angstrom, basis, frozen core orbitals)
    "cr2-sv": ("Cr 0 0 0; Cr 0 0 1.5", {"Cr": CR_SV}, 0),
    "h2o-ccpvdz-fc": ("O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", "cc-pvdz", 1),
    "n2-631g-fc": ("N 0 0 0; N 0 0 1.0977", "6-31g", 2),
    "n2-ccpvdz": ("N 0 0 0; N 0 0 1.0977", "cc-pvdz", 0),
    "h2o-ccpvdz": ("O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", "cc-pvdz", 0),
    "c2-ccpvdz": ("C 0 0 0; C 0 0 1.2425", "cc-pvdz", 0),
    "h2o-631g": ("O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", "6-31g", 0),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("molecule", choices=sorted(MOLECULES))
    ap.add_argument("--out", required=True, help="the FCIDUMP to write")
    ap.add_argument("--fci", action="store_true", help="also the exact energy (PySCF FCI)")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    from pyscf import gto, scf, mcscf, fci, lib, ao2mo
    from pyscf.tools import fcidump
    if a.threads:
        lib.num_threads(a.threads)
    atoms, basis, frozen = MOLECULES[a.molecule]
    group = SYMMETRIC.get(a.molecule)
    mol = gto.M(atom=atoms, basis=basis, symmetry=group or False, verbose=0)
    if isinstance(basis, dict):
        basis = "Ahlrichs SV"
    mf = scf.RHF(mol)
    mf.max_cycle = 300
    mf.run()
    norb = mol.nao - frozen
    nelec = mol.nelectron - 2 * frozen
    cas = mcscf.CASCI(mf, norb, nelec)
    h1, ecore = cas.get_h1eff()
    h2 = ao2mo.restore(8, cas.get_h2eff(), norb)
    orbsym = None
    if group:
        from pyscf import symm
        ids = symm.label_orb_symm(mol, mol.irrep_id, mol.symm_orb, cas.mo_coeff[:, frozen:frozen + norb])
        orbsym = [MOLPRO_D2H[int(g)] for g in ids]
    fcidump.from_integrals(a.out, h1, h2, norb, nelec, nuc=ecore, ms=0, orbsym=orbsym)
    strings = math.comb(norb, nelec // 2)
    out = {"molecule": a.molecule, "basis": basis, "frozen_core": frozen, "orbitals": norb, "electrons": nelec,
           "determinants": strings * strings, "rhf": float(mf.e_tot), "rhf_converged": bool(mf.converged),
           "fcidump": a.out}
    if a.fci:
        t = time.time()
        solver = fci.direct_spin1.FCI()
        solver.conv_tol = 1e-10
        e, _ = solver.kernel(h1, h2, norb, (nelec // 2, nelec // 2), ecore=ecore)
        out.update({"fci": float(e), "fci_seconds": time.time() - t})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
