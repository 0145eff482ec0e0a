#!/usr/bin/env python3
"""Writes the FCIDUMP of a benchmark molecule (PySCF RHF, frozen core through CASCI's effective
integrals) and, with --fci, its exact energy from PySCF's FCI on those very integrals: the
reference bench/sci_bench.py measures time to 1 mHa against.

    python3 bench/sci_molecule.py h2o-ccpvdz-fc --out H2O_ccpvdz_fc_FCIDUMP --fci [--threads 16]

Prints one JSON object (molecule, orbitals, electrons, determinants, FCI energy and seconds).
"""
import argparse
import json
import math
import time

MOLECULES = {
    # name: (atoms in Angstrom, basis, frozen core orbitals)
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
    mol = gto.M(atom=atoms, basis=basis, verbose=0)
    mf = scf.RHF(mol).run()
    norb = mol.nao - frozen
    nelec = mol.nelectron - 2 * frozen
    cas = mcscf.CASCI(mf, norb, nelec)
    h1, ecore = cas.get_h1eff()
    h2 = ao2mo.restore(8, cas.get_h2eff(), norb)
    fcidump.from_integrals(a.out, h1, h2, norb, nelec, nuc=ecore, ms=0)
    strings = math.comb(norb, nelec // 2)
    out = {"molecule": a.molecule, "basis": basis, "frozen_core": frozen, "orbitals": norb, "electrons": nelec,
           "determinants": strings * strings, "rhf": float(mf.e_tot), "fcidump": a.out}
    if a.fci:
        t = time.time()
        solver = fci.direct_spin1.FCI()
        solver.conv_tol = 1e-10
        e, _ = solver.kernel(h1, h2, norb, (nelec // 2, nelec // 2), ecore=ecore)
        out.update({"fci": float(e), "fci_seconds": time.time() - t})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
