"""sci.integrals end to end: FCIDUMP files through the stage, checked against PySCF (its own
FCIDUMP reader; for files PySCF writes from an SCF, also the SCF's integrals and energy), crafted
variants of the format against the values they were written from, and bad files refused with
exit 2 on one line that names the file's line."""
import json
import shutil

import h5py
import numpy as np
import pytest

from conftest import DEVICE, ROOT, manifest, one_line_error, run, tree_digest, write_spec
from oracle import fcidump_lines

DATA = ROOT / "tests" / "data" / "fcidump"
DICE = ["N2_sto6g_FCIDUMP", "h10_sto6g_FCIDUMP", "H2H2_FCIDUMP_nosym", "h2o_FCIDUMP_symm"]
LAYOUT = "s8: pair(i,j)=i(i+1)/2+j, i>=j, 0-based; eri[pair(pair(i,j),pair(k,l))] = (ij|kl)"
DATASETS = {"h1": ("float64", 2), "eri": ("float64", 1), "core_energy": ("float64", 0), "orbsym": ("int32", 1),
            "orbital_energies": ("float64", 1), "norb": ("int64", 0), "nelec": ("int64", 0), "ms2": ("int64", 0),
            "isym": ("int64", 0), "integral_lines": ("uint64", 0), "repeated_lines": ("uint64", 0)}
# /excitations: name -> dtype (list tables: (lists, width) with their width as an attribute)
TABLES = {"coulomb": "float64", "exchange": "float64", "single_length": "int32", "single_target": "uint8",
          "single_bound": "float64", "opposite_length": "int32", "opposite_target": "int32",
          "opposite_value": "float64", "same_length": "int32", "same_target": "int32", "same_value": "float64"}


def pyscf_or_skip():
    try:
        import pyscf.ao2mo  # noqa: F401
        import pyscf.tools.fcidump  # noqa: F401
        return pyscf
    except ImportError:
        pytest.skip("pyscf is not importable (scripts/setup.sh --test-oracles installs it into build/oracles)")


def pair(i, j):
    return i * (i + 1) // 2 + j if i >= j else j * (j + 1) // 2 + i


def eri_at(eri, i, j, k, l):
    """(ij|kl) from the packed array, by the layout the output's attribute states (not PySCF's)."""
    return eri[pair(pair(i, j), pair(k, l))]


def run_stage(tmp, fcidump, step="ints", mpi=0):
    """Runs sci.integrals on `fcidump` in a workflow of its own under tmp; returns (result, output)."""
    spec = write_spec(tmp / f"{step}.yaml", f"""
        name: {step}
        steps:
          - id: {step}
            stage: sci.integrals
            params: {{fcidump: '{fcidump}'}}
        """)
    r = run(["run", spec, "--run-dir", tmp / f"run-{step}", "--device", DEVICE], mpi=mpi)
    return r, tmp / f"run-{step}" / "outputs" / f"{step}.h5"


def read_output(path):
    """Every dataset of the output, checked for its dtype, rank and description."""
    out = {}
    with h5py.File(path) as f:
        assert set(f.keys()) == set(DATASETS) | {"excitations"}
        for name, (dtype, rank) in DATASETS.items():
            d = f[name]
            assert d.dtype == np.dtype(dtype) and d.ndim == rank, (name, d.dtype, d.shape)
            assert d.attrs["description"], name
            out[name] = d[()]
        assert set(f["excitations"].keys()) == set(TABLES)
        for name, dtype in TABLES.items():
            d = f["excitations"][name]
            assert d.dtype == np.dtype(dtype) and d.attrs["description"], name
            out["excitations/" + name] = d[()]
            if not name.startswith(("coulomb", "exchange")):
                out["excitations/" + name + ".width"] = int(d.attrs["width"])
        assert f["eri"].attrs["layout"] == LAYOUT
        assert f.attrs["qstage.stage"] == "sci.integrals"
    n = int(out["norb"])
    assert out["h1"].shape == (n, n) and out["orbsym"].shape == (n,) and out["orbital_energies"].shape == (n,)
    npair = n * (n + 1) // 2
    assert out["eri"].shape == (npair * (npair + 1) // 2,)
    return out


def repeats(lines):
    """Value lines that give an integral given before (in any of its orders)."""
    seen, count = set(), 0
    for _, *idx in lines:
        i, j, k, l = (int(x) - 1 for x in idx)
        if k >= 0:
            key = ("eri", pair(pair(i, j), pair(k, l)))
        elif j >= 0:
            key = ("h1", pair(i, j))
        else:
            continue  # orbital energies and the core line
        count += key in seen
        seen.add(key)
    return count


def check_against_pyscf_reader(out, path):
    """The stage's output against pyscf.tools.fcidump.read of the same file. PySCF keeps the last
    of an integral's repeated lines where qstage keeps the first (they agree to rounding)."""
    pyscf = pyscf_or_skip()
    ref = pyscf.tools.fcidump.read(str(path), molpro_orbsym=False, verbose=False)
    n = ref["NORB"]
    assert (int(out["norb"]), int(out["nelec"]), int(out["ms2"]), int(out["isym"])) == \
        (n, ref["NELEC"], ref["MS2"], ref.get("ISYM", 1))
    assert out["orbsym"].tolist() == ref.get("ORBSYM", [1] * n)
    assert out["core_energy"] == ref.get("ECORE", 0.0)
    np.testing.assert_allclose(out["h1"], ref["H1"], rtol=0, atol=1e-14)
    assert (out["h1"] == out["h1"].T).all()
    h2 = ref["H2"] if ref["H2"].ndim == 1 else pyscf.ao2mo.restore(8, ref["H2"], n)
    np.testing.assert_allclose(out["eri"], h2, rtol=0, atol=1e-14)
    _, lines = fcidump_lines(path)
    assert int(out["integral_lines"]) == len(lines)
    assert int(out["repeated_lines"]) == repeats(lines)


@pytest.mark.parametrize("name", DICE)
def test_dice_files_match_pyscf(tmp, name):
    r, out = run_stage(tmp, DATA / name)
    assert r.code == 0, r
    o = read_output(out)
    check_against_pyscf_reader(o, DATA / name)
    assert np.isnan(o["orbital_energies"]).all()  # none of the four has orbital-energy lines
    # The summary line: norb, nelec, ms2, the number of integrals and the core energy.
    line = f"step 'ints' result: norb {int(o['norb'])}, nelec {int(o['nelec'])}, ms2 {int(o['ms2'])}"
    assert line in r.err, r
    assert f"{int(o['integral_lines'])} integral lines" in r.err and f"core energy {float(o['core_energy']):.12f}" in r.err
    assert manifest(tmp / "run-ints")["steps"]["ints"]["results"].startswith(f"norb {int(o['norb'])}, ")


def test_h2o_symm_values(tmp):
    """A few values of Dice's H2O file read straight off its lines, and the symmetry labels."""
    r, out = run_stage(tmp, DATA / "h2o_FCIDUMP_symm")
    assert r.code == 0, r
    o = read_output(out)
    assert o["orbsym"].tolist() == [2, 1, 3, 1] and int(o["norb"]) == 4 and int(o["nelec"]) == 6
    assert o["core_energy"] == -59.666632990394
    assert o["h1"][3, 3] == -1.985435890884
    assert eri_at(o["eri"], 0, 0, 0, 0) == 0.7708073798986


@pytest.mark.parametrize("molecule", ["h2o", "n2"])
def test_pyscf_written_files(tmp, molecule):
    """PySCF writes the FCIDUMP of an RHF calculation; the stage's output matches PySCF's reader,
    the SCF's own MO integrals, and gives back the RHF energy."""
    pyscf = pyscf_or_skip()
    from pyscf import ao2mo, gto, scf
    from pyscf.tools import fcidump
    atoms = {"h2o": "O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", "n2": "N 0 0 0; N 0 0 1.098"}[molecule]
    mol = gto.M(atom=atoms, basis="sto-3g", symmetry=True, verbose=0)
    mf = scf.RHF(mol).run()
    assert mf.converged
    path = tmp / f"{molecule}.fcidump"
    fcidump.from_scf(mf, str(path))
    r, out = run_stage(tmp, path)
    assert r.code == 0, r
    o = read_output(out)
    check_against_pyscf_reader(o, path)
    assert len(set(o["orbsym"].tolist())) > 1, "symmetry labels expected"
    # The MO integrals PySCF wrote (h_ij for i >= j), at their 16 digits (and below 1e-15 left out).
    c = mf.mo_coeff
    n = c.shape[1]
    h = np.tril(c.T @ mf.get_hcore() @ c)
    np.testing.assert_allclose(o["h1"], h + np.tril(h, -1).T, rtol=1e-15, atol=2e-15)
    np.testing.assert_allclose(o["eri"], ao2mo.restore(8, ao2mo.full(mol, c), n), rtol=1e-15, atol=2e-15)
    assert abs(float(o["core_energy"]) - mol.energy_nuc()) < 1e-13
    # The RHF energy from the output alone, (ij|kl) looked up by the layout attribute's formula.
    occ = int(o["nelec"]) // 2
    e = float(o["core_energy"]) + 2 * sum(o["h1"][i, i] for i in range(occ))
    e += sum(2 * eri_at(o["eri"], i, i, j, j) - eri_at(o["eri"], i, j, i, j) for i in range(occ) for j in range(occ))
    assert abs(e - mf.e_tot) < 1e-9, (e, mf.e_tot)


# ---------------------------------------------------------------- crafted variants of the format

def crafted(seed=3, n=4):
    """Integrals of n orbitals with the 8-fold symmetry and values of every size."""
    rng = np.random.default_rng(seed)
    npair = n * (n + 1) // 2
    h1 = rng.normal(size=(n, n)) * 10.0 ** rng.integers(-9, 2, size=(n, n))
    h1 = np.tril(h1) + np.tril(h1, -1).T
    eri = rng.normal(size=npair * (npair + 1) // 2) * 10.0 ** rng.integers(-12, 1, size=npair * (npair + 1) // 2)
    return h1, eri, float(rng.normal() * 30)


def orders(i, j, k, l):
    """The 8 orders of (ij|kl), as written (some the same when indices coincide)."""
    return [(i, j, k, l), (j, i, k, l), (i, j, l, k), (j, i, l, k), (k, l, i, j), (l, k, i, j), (k, l, j, i),
            (l, k, j, i)]


def fmt_e(v):
    return repr(float(v))  # shortest round trip: 1e-05, 0.123, -3.2e+01


def fmt_d(v):
    return f"{v:.17E}".replace("E", "D")  # Fortran: 1.23450000000000000D-05


VARIANTS = {
    # header, number format, core first, all 8 orders and both h1 orders, orbital energies
    "one-line &END, UHF=.FALSE., core first, E exponents":
        (" &FCI NORB=4,NELEC=4,MS2=0,ORBSYM=1,2,1,2,ISYM=2,UHF=.FALSE. &END\n", fmt_e, True, False, False),
    "multi-line /, core last, D exponents":
        ("&FCI NORB= 4,\n NELEC=4, MS2=0,\n ORBSYM=1,2,1,2,\n ISYM=2,\n /\n", fmt_d, False, False, False),
    "multi-line $END, all 8 orders of every integral, orbital energies":
        (" &FCI NORB=4,NELEC=4,MS2=0,\n  ORBSYM=1,2,1,2,\n  ISYM=2,UHF=.FALSE.,\n $END\n", fmt_e, False, True, True),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_crafted_variants(tmp, variant):
    header, number, core_first, all_orders, energies = VARIANTS[variant]
    h1, eri, core = crafted()
    n = h1.shape[0]
    lines, unique = [], 0
    if core_first:
        lines.append(f"{number(core)} 0 0 0 0")
    for i in range(n):
        for j in range(i + 1):
            for k in range(n):
                for l in range(k + 1):
                    if pair(k, l) > pair(i, j):
                        continue
                    v = number(eri[pair(pair(i, j), pair(k, l))])
                    unique += 1
                    for q in (orders(i, j, k, l) if all_orders else [(i, j, k, l)]):
                        lines.append(f"{v} {' '.join(str(x + 1) for x in q)}")
    for i in range(n):
        for j in range(i + 1):
            for q in ([(i, j), (j, i)] if all_orders and i != j else [(i, j)]):
                lines.append(f"{number(h1[i, j])} {q[0] + 1} {q[1] + 1} 0 0")
    given_energies = {0: -20.5, 1: -1.25, 3: 0.5}  # orbital 3 (index 2) has none
    if energies:
        lines += [f"{number(e)} {i + 1} 0 0 0" for i, e in given_energies.items()]
    if not core_first:
        lines.append(f"{number(core)}  0  0  0  0")
    path = tmp / "crafted.fcidump"
    path.write_text(header + "\n".join(lines) + "\n")
    r, out = run_stage(tmp, path)
    assert r.code == 0, r
    o = read_output(out)
    assert (o["h1"] == h1).all() and (o["eri"] == eri).all() and o["core_energy"] == core
    assert o["orbsym"].tolist() == [1, 2, 1, 2] and int(o["isym"]) == 2
    assert int(o["integral_lines"]) == len(lines)
    assert int(o["repeated_lines"]) == repeats([l.split() for l in lines])
    if all_orders:
        assert int(o["repeated_lines"]) > unique  # most integrals came 4 or 8 times
    expected_energies = [given_energies.get(i, np.nan) if energies else np.nan for i in range(n)]
    np.testing.assert_array_equal(o["orbital_energies"], expected_energies)  # NaN where absent


def expected_tables(o):
    """The excitation tables as stages/sci/excitation_tables.hpp defines them, from the output's
    own h1 and eri: kind -> (lengths, targets, values) padded to the widest list."""
    n, h1, eri = int(o["norb"]), o["h1"], o["eri"]

    def e(i, j, k, l):
        return float(eri_at(eri, i, j, k, l))

    def padded(lists):
        width = max((len(l) for l in lists), default=0)
        lengths, targets, values = [], np.zeros((len(lists), width), np.int64), np.zeros((len(lists), width))
        for row, entries in enumerate(lists):
            entries.sort(key=lambda x: (-abs(x[2]), x[0], x[1]))
            lengths.append(len(entries))
            for k, (r, t, v) in enumerate(entries):
                targets[row, k], values[row, k] = r | t << 8, v
        return np.array(lengths, np.int64), targets, values

    singles = []
    for p in range(n):
        entries = []
        for r in range(n):
            if r != p:
                bound = abs(float(h1[p, r]))
                for k in range(n):
                    j = e(p, r, k, k)
                    same = j - e(p, k, k, r)
                    bound += max(abs(j), abs(same), abs(j + same))
                if bound > 0:
                    entries.append((r, 0, bound))
        singles.append(entries)
    opposite = [[(r, t, e(p, r, q, t)) for r in range(n) for t in range(n) if r != p and t != q and e(p, r, q, t) != 0]
                for p in range(n) for q in range(n)]
    same = [[(r, t, e(p, r, q, t) - e(p, t, q, r)) for t in range(n) for r in range(t) if not {r, t} & {p, q}
             and e(p, r, q, t) - e(p, t, q, r) != 0] for q in range(n) for p in range(q)]
    return {"single": padded(singles), "opposite": padded(opposite), "same": padded(same)}


ONE_ORBITAL = " &FCI NORB=1,NELEC=2,MS2=0 &END\n 0.5 1 1 1 1\n -1.0 1 1 0 0\n 0.25 0 0 0 0\n"


@pytest.mark.parametrize("name", DICE + ["one orbital"])
def test_excitation_tables(tmp, name):
    """/excitations against the definitions in stages/sci/excitation_tables.hpp, entry for entry."""
    path = DATA / name
    if name == "one orbital":
        path = tmp / "one.fcidump"
        path.write_text(ONE_ORBITAL)
    r, out = run_stage(tmp, path)
    assert r.code == 0, r
    o = read_output(out)
    n = int(o["norb"])
    x = lambda name: o["excitations/" + name]  # noqa: E731
    assert (x("coulomb") == [[eri_at(o["eri"], p, p, q, q) for q in range(n)] for p in range(n)]).all()
    assert (x("exchange") == [[eri_at(o["eri"], p, q, q, p) for q in range(n)] for p in range(n)]).all()
    for kind, (lengths, targets, values) in expected_tables(o).items():
        value = "bound" if kind == "single" else "value"
        width = targets.shape[1]
        assert x(kind + "_length").tolist() == lengths.tolist(), kind
        assert x(kind + "_target").shape == targets.shape and (x(kind + "_target") == targets).all(), kind
        assert x(kind + "_" + value).shape == values.shape and (x(kind + "_" + value) == values).all(), kind
        for d in ["_length", "_target", "_" + value]:
            assert x(kind + d + ".width") == width, (kind, d)
    if name == "N2_sto6g_FCIDUMP":
        assert min(x("same_target.width"), x("opposite_target.width"), x("single_target.width")) > 0


def test_single_bounds_hold_for_every_determinant(tmp):
    """Heat-bath screening cuts p's singles at bound * |c| <= eps, so each bound must be at least
    |<D'|H|D>| for every determinant D with p occupied and r empty, whichever spin moves: checked
    here for all of them, by brute force (an orbital holding both spins once broke this)."""
    r, out = run_stage(tmp, DATA / "N2_sto6g_FCIDUMP")
    assert r.code == 0, r
    o = read_output(out)
    n, h1, eri = int(o["norb"]), o["h1"], o["eri"]
    na = nb = int(o["nelec"]) // 2
    lengths, targets, bounds = (o["excitations/single_" + k] for k in ("length", "target", "bound"))
    occ = lambda count: np.array([[(s >> k) & 1 for k in range(n)] for s in range(1 << n) if bin(s).count("1") == count])  # noqa: E731
    strings = {na: occ(na), nb: occ(nb)}
    checked = tight = 0
    for p in range(n):
        for slot in range(int(lengths[p])):
            r_ = int(targets[p, slot])
            j = np.array([eri_at(eri, p, r_, k, k) for k in range(n)])
            same = j - np.array([eri_at(eri, p, k, k, r_) for k in range(n)])
            for moving, other in ((strings[na], strings[nb]), (strings[nb], strings[na])):
                movable = moving[(moving[:, p] == 1) & (moving[:, r_] == 0)]
                # |h_pr + sum over the moving spin's electrons of J - K + sum over the other's of J|
                element = np.abs(h1[p, r_] + (movable @ same)[:, None] + (other @ j)[None, :])
                assert element.max() <= bounds[p, slot] * (1 + 1e-12), (p, r_, element.max(), bounds[p, slot])
                checked += element.size
                tight = max(tight, element.max() / bounds[p, slot])
    assert checked > 10**5 and tight > 0.5


def test_output_layout_matches_its_schema(tmp):
    jsonschema = pytest.importorskip("jsonschema")
    r, out = run_stage(tmp, DATA / "H2H2_FCIDUMP_nosym")
    assert r.code == 0, r
    r = run(["inspect", out, "--json"])
    assert r.code == 0, r
    schema = json.loads((ROOT / "schemas" / "outputs" / "sci.integrals.json").read_text())
    jsonschema.validate(json.loads(r.out), schema)


def test_same_output_on_two_ranks(tmp):
    r1, one = run_stage(tmp, DATA / "N2_sto6g_FCIDUMP", step="one")
    assert r1.code == 0, r1
    r2, two = run_stage(tmp, DATA / "N2_sto6g_FCIDUMP", step="two", mpi=2)
    assert r2.code == 0, r2
    a, b = read_output(one), read_output(two)
    for name in DATASETS:
        np.testing.assert_array_equal(a[name], b[name])


# ---------------------------------------------------------------- bad files

HEAD = " &FCI NORB=2,NELEC=2,MS2=0,\n  ORBSYM=1,1,\n  ISYM=1,\n &END\n"
GOOD_LINES = " 0.5 1 1 1 1\n 0.25 2 2 1 1\n -1.0 1 1 0 0\n -0.5 2 2 0 0\n 0.7 0 0 0 0\n"

# name -> (file text, the line the message names, fragments of the message)
BAD = {
    "header only": (HEAD, 5, ["a header but no integrals", "a truncated file?"]),
    "no end of header": (" &FCI NORB=2,NELEC=2,MS2=0,\n  ORBSYM=1,1,\n", 1,
                         ["the namelist header has no end", "expected '&END', '$END' or '/'"]),
    "cut inside a line": (HEAD + GOOD_LINES + " 0.125 2 1", 10, ["3 fields; expected 5", "truncated?"]),
    "NaN value": (HEAD + " 0.5 1 1 1 1\n NaN 2 2 1 1\n", 6, ["'NaN' is not finite", "expected a finite integral"]),
    "infinite value": (HEAD + " 0.5 1 1 1 1\n 1.0D+999 2 2 1 1\n", 6, ["is not finite"]),
    "index beyond NORB": (HEAD + GOOD_LINES.replace(" 0.25 2 2 1 1", " 0.25 3 2 1 1"), 6,
                          ["orbital index 3 is outside 0..NORB=2", "expected 1-based orbitals"]),
    "UHF": (" &FCI NORB=2,NELEC=2,MS2=0,UHF=.TRUE.\n &END\n" + GOOD_LINES, 1,
            ["UHF=.TRUE.", "expected restricted (UHF=.FALSE.) integrals"]),
    "NORB above 64": ("\n &FCI NORB=65,NELEC=2,MS2=0 &END\n" + GOOD_LINES, 2,
                      ["NORB=65 is more than 64 orbitals", "expected at most 64"]),
    "NELEC parity against MS2": (HEAD.replace("NELEC=2", "NELEC=3"), 1,
                                 ["NELEC=3 and MS2=0 do not describe whole alpha and beta electrons",
                                  "expected NELEC + MS2 even"]),
    "more electrons of a spin than orbitals": (HEAD.replace("NELEC=2,MS2=0", "NELEC=4,MS2=2") + GOOD_LINES, 1,
                                               ["3 alpha and 1 beta electrons into 2 orbitals", "expected at most NORB"]),
    "a repeat with another value": (HEAD + GOOD_LINES + " 0.2501 1 1 2 2\n", 10,
                                    ["repeats the integral of line 6 with another value"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_exit_2_naming_the_line(tmp, case):
    text, line, fragments = BAD[case]
    path = tmp / "bad.fcidump"
    path.write_text(text)
    r, out = run_stage(tmp, path)
    error = one_line_error(r, "step 'ints' (sci.integrals): ", f"{path}:{line}: ", "; expected", *fragments)
    assert "\n" not in error
    assert not out.exists()


def test_missing_file_is_refused_before_running(tmp):
    r, out = run_stage(tmp, tmp / "absent.fcidump")
    one_line_error(r, "absent.fcidump")
    assert not out.exists()


def test_a_failing_step_leaves_committed_outputs_untouched(tmp):
    """An earlier step stays committed when a later one meets a bad file; a step that had been
    committed before its file went bad keeps its old output too."""
    shutil.copy(DATA / "h2o_FCIDUMP_symm", tmp / "first.fcidump")
    shutil.copy(DATA / "H2H2_FCIDUMP_nosym", tmp / "second.fcidump")
    spec = write_spec(tmp / "spec.yaml", """
        name: two
        steps:
          - id: first
            stage: sci.integrals
            params: {fcidump: first.fcidump}
          - id: second
            stage: sci.integrals
            params: {fcidump: second.fcidump}
          - id: third
            stage: sci.integrals
            params: {fcidump: third.fcidump}
        """)
    shutil.copy(DATA / "h2o_FCIDUMP_symm", tmp / "third.fcidump")
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    outputs = tmp / "run" / "outputs"
    before = tree_digest(outputs)
    # The second file goes bad at its line 7: the first step is reused, the second fails.
    lines = (tmp / "second.fcidump").read_text().splitlines(keepends=True)
    lines[6] = " nan 1 1 2 2\n"
    (tmp / "second.fcidump").write_text("".join(lines))
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    one_line_error(r, "step 'second' (sci.integrals): ", "second.fcidump:7: ", "is not finite")
    assert tree_digest(outputs) == before
    steps = manifest(tmp / "run")["steps"]
    assert steps["first"]["state"] == "done"
    # A new run into a fresh directory commits the first step before failing on the second.
    r = run(["run", spec, "--run-dir", tmp / "fresh", "--device", DEVICE])
    one_line_error(r, "second.fcidump:7: ")
    with h5py.File(tmp / "fresh" / "outputs" / "first.h5") as f:
        assert f["norb"][()] == 4
    assert not (tmp / "fresh" / "outputs" / "second.h5").exists()
    assert not (tmp / "fresh" / "outputs" / "third.h5").exists()


def test_example_workflow_runs(tmp):
    r = run(["run", ROOT / "workflows" / "sci-integrals.yaml", "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    with h5py.File(tmp / "run" / "outputs" / "n2.h5") as f:
        assert f["norb"][()] == 10 and f["nelec"][()] == 14
