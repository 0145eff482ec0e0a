"""mps.tebd against TeNPy (PyPI physics-tenpy, a test oracle from scripts/setup.sh --test-oracles):
the same XXZ quench (TeNPy's XXZChain with Jxx = J, Jz = J delta, hz = h, conserve='Sz') from the
same product state, TEBDEngine with the same order, dt, number of steps and trunc_params.

The circuits. TeNPy's bond i is left of site i, so its "odd" bonds are qstage's pairs (0,1), (2,3),
...; its onsite terms are split half to each bond and whole at the chain's ends, as qstage's field.
At order 2 one TEBDEngine.evolve(1, dt) is [odd dt/2, even dt, odd dt/2]: qstage's Strang step,
gate for gate, truncation for truncation, so even truncated runs agree to rounding. At order 4
TeNPy applies Suzuki's U(a) U(a) U(1-4a) U(a) U(a) (qstage's weights) but merges the two half
layers where two Strang steps meet (exp(A a dt/2)^2 = exp(A a dt): 11 layers where qstage applies
15). Untruncated that is the same operator, so the states agree to rounding; truncated, TeNPy
truncates after 4 fewer layers a step, so the states differ by the truncations (tolerance below).

TeNPy 1.1.1's TEBDEngine.run() adds each step's truncation error to engine.trunc_err twice
(evolve() adds it and run_evolution() adds it again); these tests sum what evolve() returns, which
is what the engine's per-bond errors sum to."""
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import ROOT
from test_mps import init_step, read, run_steps, tebd_step

OUTPUTS = ("density", "entropy_vN", "entropy_2", "charge_distribution", "energy", "truncation_error", "chi")


def tenpy_or_skip():
    try:
        import tenpy  # noqa: F401
        from tenpy.algorithms.tebd import TEBDEngine
        from tenpy.models.xxz_chain import XXZChain
        from tenpy.networks.mps import MPS
        return XXZChain, MPS, TEBDEngine
    except ImportError:
        pytest.skip("tenpy is not importable (scripts/setup.sh --test-oracles installs physics-tenpy into build/oracles)")


def xxz_model(L, J, delta, h):
    XXZChain, _, _ = tenpy_or_skip()
    return XXZChain({"L": L, "Jxx": J, "Jz": J * delta, "hz": h, "conserve": "Sz", "bc_MPS": "finite"})


def tenpy_measure(psi, model, eps):
    """The outputs of mps.tebd, measured on TeNPy's MPS: n = S^z + 1/2, entropies of bonds
    1..L-1, P(n particles on sites 0..L/2-1) from the charges 2 S^z of bond L/2, <H>."""
    L = psi.L
    N = int(round(np.sum(psi.expectation_value("Sz").real) + L / 2))
    q, p = psi.probability_per_charge(bond=L // 2)
    dist = np.zeros(N + 1)
    for (two_sz,), prob in zip(q, p):
        dist[(two_sz + L // 2) // 2] += prob
    return {"density": psi.expectation_value("Sz").real + 0.5, "entropy_vN": psi.entanglement_entropy(),
            "entropy_2": psi.entanglement_entropy(n=2), "charge_distribution": dist,
            "energy": np.sum(model.bond_energies(psi)).real, "truncation_error": eps, "chi": np.array(psi.chi)}


def tenpy_tebd(occ, J, delta, h, dt, steps, order, trunc, every):
    """TEBDEngine from the product state `occ` (1 = up); returns (outputs stacked over the
    measurement times t = 0, every k steps and after the last, as mps.tebd's, final MPS)."""
    _, MPS, TEBDEngine = tenpy_or_skip()
    model = xxz_model(len(occ), J, delta, h)
    psi = MPS.from_product_state(model.lat.mps_sites(), ["up" if n else "down" for n in occ], bc="finite",
                                 unit_cell_width=model.lat.mps_unit_cell_width)
    eng = TEBDEngine(psi, model, {"order": order, "trunc_params": dict(trunc)})
    eps = 0.0
    rows = [tenpy_measure(psi, model, eps)]
    eng.prepare_evolve(dt)
    for step in range(1, steps + 1):
        eps += eng.evolve(1, dt).eps
        if step % every == 0 or step == steps:
            rows.append(tenpy_measure(psi, model, eps))
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}, psi


def yaml_map(d):
    return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"


def both(tmp, L, state, occ, J, delta, h, dt, steps, order, trunc, every):
    """The same quench in qstage and TeNPy: (qstage's outputs, TeNPy's, TeNPy's final MPS, qstage's state file)."""
    init = {"L": L, "state": state}
    tebd = {"J": J, "delta": delta, "h": h, "dt": dt, "steps": steps, "order": order, "measure_every": every,
            "trunc": yaml_map(trunc)}
    r, out = run_steps(tmp, init_step(yaml_map(init)) + tebd_step(yaml_map(tebd)))
    assert r.code == 0, r
    q = dict(zip(OUTPUTS, read(out / "evo.h5", *OUTPUTS)))
    t, psi = tenpy_tebd(occ, J, delta, h, dt, steps, order, trunc, every)
    assert t["density"].shape == q["density"].shape
    return q, t, psi, out / "evo.h5"


def neel(L):
    return [1 - j % 2 for j in range(L)]   # qstage's neel (first: odd): 1-based sites 1, 3, ... up


def domain_wall(L):
    return [1] * (L // 2) + [0] * (L - L // 2)


def max_diffs(q, t):
    return {k: float(np.max(np.abs(q[k] - t[k]))) for k in OUTPUTS if k not in ("chi", "truncation_error")}


# ---------------------------------------------------------------- files: docs/mps.md's route to TeNPy

def docs_snippet():
    """The Python block of docs/mps.md that loads a state file into TeNPy."""
    text = (ROOT / "docs" / "mps.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "from_Bflat" in b]
    assert len(blocks) == 1, "docs/mps.md should hold one python block that calls MPS.from_Bflat"
    return blocks[0]


def load_into_tenpy(path):
    """TeNPy's MPS of a qstage state file, by docs/mps.md's snippet run as written."""
    tenpy_or_skip()
    env = {"path": str(path)}
    exec(docs_snippet().replace('"psi.h5"', "path"), env)
    return env["psi"]


# ---------------------------------------------------------------- untruncated: the same operator

@pytest.mark.parametrize("order", [2, 4])
@pytest.mark.parametrize("state,occ,delta,h", [("neel", neel(10), 0.5, 0.3), ("domain_wall", domain_wall(10), 1.0, 0.0)])
def test_untruncated_tebd_matches_tenpy_to_rounding(tmp, order, state, occ, delta, h):
    """L = 10, chi_max 64 (never reached: the largest Schmidt rank is 32), the default svd_min and
    trunc_cut (1e-14): both apply exp(-i H dt) as the same Trotter product, so every output agrees to
    rounding at each of 20 steps, and the final Schmidt spectra do. chi is compared on the spectra
    above 1e-12: values at rounding level (~1e-14) may fall on either side of svd_min in the two codes."""
    q, t, psi_t, path = both(tmp, 10, state, occ, 0.8, delta, h, 0.05, 20, order, {"chi_max": 64}, 1)
    for k, diff in max_diffs(q, t).items():
        assert diff < 1e-10, (k, diff)
    assert q["entropy_vN"][-1].max() > 0.3                    # entangled: not a comparison of product states
    assert q["truncation_error"][-1] < 1e-20 and t["truncation_error"][-1] < 1e-20
    with h5py.File(path) as f:
        off, lam = f["bond_offsets"][()], f["lambda"][()]
    for k in range(1, 10):
        mine, theirs = np.sort(lam[off[k]:off[k + 1]])[::-1], np.sort(psi_t.get_SL(k))[::-1]
        n = np.sum(mine > 1e-12)
        assert n == np.sum(theirs > 1e-12) and n > 1
        assert np.allclose(mine[:n], theirs[:n], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- truncated

def test_truncated_second_order_tebd_makes_tenpys_truncations(tmp):
    """Order 2 is the same circuit with the same truncation after every bond update (chi_max,
    svd_min, trunc_cut on Schmidt values normalised to 1, the kept ones renormalised, B' = C Y^dagger).
    Each truncation is a function of Theta that is continuous away from a tie at the cut, so the
    runs stay together to rounding even with chi_max cutting at every update: L = 24, chi_max 16,
    to t = 2. chi is the same at every bond and time, and the accumulated discarded weight agrees
    to rounding relative to itself."""
    trunc = {"chi_max": 16, "svd_min": 1.0e-10, "trunc_cut": 1.0e-12}
    q, t, _, _ = both(tmp, 24, "neel", neel(24), 1.0, 0.5, 0.0, 0.05, 40, 2, trunc, 5)
    for k, diff in max_diffs(q, t).items():
        assert diff < 1e-10, (k, diff)
    assert (q["chi"] == t["chi"]).all() and q["chi"].max() == 16
    eps_q, eps_t = q["truncation_error"], t["truncation_error"]
    assert eps_q[-1] > 1e-9                                    # it does truncate
    assert np.allclose(eps_q, eps_t, rtol=1e-8, atol=1e-20), (eps_q, eps_t)


def test_truncated_domain_wall_matches_tenpy(tmp):
    """The domain wall with a field: entanglement grows slowly (log t), chi_max 6 cuts from t ~ 1
    on; order 2, so agreement to rounding as for the Neel state."""
    trunc = {"chi_max": 6, "svd_min": 1.0e-10}
    q, t, _, _ = both(tmp, 20, "domain_wall", domain_wall(20), 1.0, 0.3, 0.2, 0.05, 60, 2, trunc, 10)
    for k, diff in max_diffs(q, t).items():
        assert diff < 1e-10, (k, diff)
    assert (q["chi"] == t["chi"]).all() and q["chi"].max() == 6
    assert q["truncation_error"][-1] > 1e-9
    assert np.allclose(q["truncation_error"], t["truncation_error"], rtol=1e-8, atol=1e-20)


def binary_entropy(x):
    x = np.clip(x, 1e-300, 0.5)
    return -x * np.log(x) - (1 - x) * np.log1p(-x)


def test_truncated_fourth_order_tebd_agrees_within_the_truncation_error(tmp):
    """Order 4 truncated: TeNPy truncates after 11 layers a step, qstage after 15, so the runs are
    two different truncations of the same exact Trotter state, and agree only within the truncation
    error. The tolerance: TeNPy's TruncationError bounds a run's fidelity with the untruncated state,
    |<psi_trunc|psi>|^2 >= 1 - 2 eps (its `ov`); as angles (arccos of the overlap) obey the triangle
    inequality, the two runs' states are at most theta = theta_q + theta_t apart, theta_x =
    arcsin(sqrt(2 eps_x)), i.e. their trace distance is at most T = sin(theta). Then (T is the
    trace distance of every reduced density matrix too):
      - a projector's expectation (n_j, P(N_left = n)) differs by <= T;
      - <H> by <= 2 T ||H||, ||H|| <= (L - 1)(|J|/2 + |J delta|/4);
      - S_vN of bond k by <= T ln(D - 1) + h(T) (Fannes-Audenaert; D = 2^min(k, L-k));
      - S_2 = -ln P, P = tr rho^2: |P_q - P_t| <= 2 T, so by <= 2 T / min(P_q, P_t).
    The overlap of the two final states, computed in TeNPy, obeys the same bound. Measured (L = 16,
    chi_max 8, t = 2, eps ~ 2e-6, T ~ 4e-3): the states' trace distance is 1.4e-3, a third of T, but
    the outputs agree far more closely than T allows (densities 5e-8, S_vN 5e-7)."""
    L, J, delta, steps = 16, 1.0, 0.5, 40
    trunc = {"chi_max": 8, "svd_min": 1.0e-10}
    q, t, psi_t, path = both(tmp, L, "neel", neel(L), J, delta, 0.0, 0.05, steps, 4, trunc, 5)
    eps_q, eps_t = q["truncation_error"], t["truncation_error"]
    assert eps_q[-1] > 1e-6 and eps_t[-1] > 1e-6               # it does truncate
    theta = np.arcsin(np.sqrt(2 * eps_q)) + np.arcsin(np.sqrt(2 * eps_t))
    T = np.sin(theta)[:, None]
    assert T.max() < 0.1
    for k in ("density", "charge_distribution"):
        assert (np.abs(q[k] - t[k]) <= T).all(), k
    assert (np.abs(q["energy"] - t["energy"]) <= 2 * T[:, 0] * (L - 1) * (abs(J) / 2 + abs(J * delta) / 4)).all()
    D = 2.0 ** np.minimum(np.arange(1, L), L - np.arange(1, L))
    assert (np.abs(q["entropy_vN"] - t["entropy_vN"]) <= T * np.log(D - 1) + binary_entropy(T)).all()
    P = np.minimum(np.exp(-q["entropy_2"]), np.exp(-t["entropy_2"]))
    assert (np.abs(q["entropy_2"] - t["entropy_2"]) <= 2 * T / P).all()
    overlap = abs(load_into_tenpy(path).overlap(psi_t))
    assert np.sqrt(1 - min(overlap, 1) ** 2) <= T[-1, 0], (overlap, T[-1, 0])
    # the same constraints bind: chi_max on the same bonds at the end
    assert ((q["chi"][-1] == 8) == (t["chi"][-1] == 8)).all()


def test_the_docs_snippet_loads_a_qstage_state_into_tenpy(tmp):
    """docs/mps.md's snippet, run as written on an evolved qstage state: TeNPy's MPS of it is
    canonical, has qstage's Schmidt values, densities and entropies, its energy under TeNPy's model,
    and overlaps TeNPy's own evolution of the same quench to 1 (untruncated: the same state)."""
    L, steps = 12, 15
    q, t, psi_t, path = both(tmp, L, "neel", neel(L), 1.0, 0.7, 0.0, 0.1, steps, 2, {"chi_max": 64}, steps)
    psi = load_into_tenpy(path)
    assert psi.L == L and psi.form == [(0.0, 1.0)] * L           # B form
    assert np.max(np.abs(psi.norm_test())) < 1e-12
    assert abs(psi.overlap(psi_t)) == pytest.approx(1, abs=1e-12)
    model = xxz_model(L, 1.0, 0.7, 0.0)
    mine = tenpy_measure(psi, model, 0.0)
    for k in ("density", "entropy_vN", "entropy_2", "charge_distribution", "energy"):
        assert np.max(np.abs(mine[k] - q[k][-1])) < 1e-12, k
    with h5py.File(path) as f:
        off, lam = f["bond_offsets"][()], f["lambda"][()]
    for k in range(1, L):
        assert np.allclose(np.sort(psi.get_SL(k)), np.sort(lam[off[k]:off[k + 1]]), atol=1e-14)
    # a two-point function, which the outputs do not hold, against TeNPy's own run
    zz = psi.correlation_function("Sz", "Sz")
    assert np.max(np.abs(zz - psi_t.correlation_function("Sz", "Sz"))) < 1e-12
