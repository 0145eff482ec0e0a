"""mps.tebd over MPI ranks (docs/mps.md, "Ranks"): every rank holds the MPS, the updates of a
brickwork layer are split over the ranks and the new sites exchanged, so the outputs under
`mpirun -np 2` and `-np 3` are bitwise identical (every dataset) to a 1-rank run: a truncated XXZ
quench from a random state, and a lossy interferometer (a density matrix, single updates). A
SIGTERM-stopped 2-rank run resumes on 3 ranks to the same bits."""
import re
from pathlib import Path

import h5py
import pytest

from conftest import DEVICE, run, sigterm_mpi_run, write_spec
from test_mps import init_step, tebd_step
from test_mps_resume import LONG, digests, spec

WORKFLOWS = {
    # chi_max 10 truncates from the first steps (the random start already has chi 16); 4th order
    # gives layers of every size, the field makes the bond terms differ.
    "xxz": init_step("{L: 20, state: random, total_charge: 10, chi: 16, seed: 3}") +
           tebd_step("{J: 1, delta: 0.5, h: 0.2, dt: 0.05, steps: 6, order: 4, measure_every: 2, "
                     "trunc: {chi_max: 10, svd_min: 1.0e-10}}"),
    # n_pair keys, one beam splitter a step (the ranks take turns, the others receive each), a
    # weight, canonicalize after lossy gates, truncated.
    "lossy": init_step("{L: 5, d: 6, state: squeezed, squeezing: [0.5, 0.4, 0.5, 0.3, 0], eta: 0.5}") +
             tebd_step("{model: interferometer, haar_seed: 3, measure_every: 2, trunc: {chi_max: 40}}"),
}


def run_workflow(tmp, name, ranks):
    tmp.mkdir(parents=True, exist_ok=True)
    s = write_spec(tmp / f"{name}.yaml", f"name: {name}\nsteps:\n{WORKFLOWS[name]}")
    run_dir = tmp / f"run-{name}-{ranks}"
    r = run(["run", s, "--run-dir", run_dir, "--device", DEVICE], mpi=ranks if ranks > 1 else None, timeout=600)
    assert r.code == 0, r
    with h5py.File(run_dir / "outputs" / "evo.h5") as f:
        assert f.attrs["qstage.ranks"] == ranks
    return run_dir


def rank_logs(run_dir):
    return {int(p.stem.split("-")[1]): p.read_text() for p in (Path(run_dir) / "logs").glob("rank-*.log")}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one")
    return {name: digests(run_workflow(tmp, name, 1)) for name in WORKFLOWS}


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", list(WORKFLOWS))
def test_ranks_give_the_bits_of_one_rank(one_rank, tmp, name, ranks):
    run_dir = run_workflow(tmp, name, ranks)
    got = digests(run_dir)
    assert sorted(got) == sorted(one_rank[name])
    for dataset in got:
        assert got[dataset] == one_rank[name][dataset], dataset
    with h5py.File(run_dir / "outputs" / "evo.h5") as f:
        if name == "xxz":
            assert f["truncation_error"][-1] > 1e-8, "the quench did not truncate"
            assert f["chi"][0].max() > 10 and f["chi"][-1].max() == 10
        else:
            assert f.attrs["charge_kind"] == "n_pair"
    # Each rank logs its share: the left sites it updated and what its exchanges moved.
    logs = rank_logs(run_dir)
    assert sorted(logs) == list(range(ranks))
    shares = {}
    for r, text in logs.items():
        m = re.search(rf"rank {r} of {ranks}: those are its share, by left site \(times\): (.*?); (\d+) exchanges in "
                      r"[0-9.]+ s, (\d+) bytes sent, (\d+) bytes received", text)
        assert m, text
        shares[r] = m.group(1)
        assert int(m.group(2)) > 0 and int(m.group(4)) > 0
    # xxz: layers of 5 and 4 bonds; lossy: 10 single updates, the ranks take turns. Every rank computes some.
    assert all(s != "none" for s in shares.values()), shares


# ---------------------------------------------------------------- stop on 2 ranks, resume on 3

def test_a_stopped_two_rank_run_resumes_on_three_ranks_with_the_bits_of_one(tmp):
    clean = tmp / "clean"
    r = run(["run", spec(tmp / "c", LONG, ", checkpoint_every: 5"), "--run-dir", clean, "--device", DEVICE])
    assert r.code == 0, r
    s = spec(tmp / "s", LONG, ", checkpoint_every: 5")
    run_dir = tmp / "run"
    state = run_dir / "steps" / "evo" / "run-state.bin"
    code, err = sigterm_mpi_run(2, ["run", s, "--run-dir", run_dir, "--device", DEVICE], state)
    if code == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert code == 75, err
    m = re.search(r"stopped by SIGTERM in step 'evo' after (\d+) of 120 time steps \(committed\)", err)
    assert m, err
    stopped = int(m.group(1))
    assert 5 <= stopped < 120
    r = run(["resume", run_dir, "--device", DEVICE], mpi=3, timeout=600)
    assert r.code == 0, r
    assert f"mps.tebd: resuming after time step {stopped} of 120" in rank_logs(run_dir)[0]
    with h5py.File(run_dir / "outputs" / "evo.h5") as f:
        assert f.attrs["qstage.ranks"] == 3
    assert digests(run_dir) == digests(clean)


def test_an_input_error_inside_compute_fails_every_rank_with_exit_2(tmp):
    """make_evolution refuses d = 3 for XXZ inside compute(), on every rank: the runner agrees the
    error over the ranks (no rank waits in a collective) and reports it once."""
    from conftest import one_line_error
    tmp.mkdir(parents=True, exist_ok=True)
    s = write_spec(tmp / "d3.yaml", "name: d3\nsteps:\n" + init_step("{L: 4, d: 3, state: neel}") +
                   tebd_step("{dt: 0.1, steps: 2}"))
    r = run(["run", s, "--run-dir", tmp / "run", "--device", DEVICE], mpi=3, timeout=120)
    one_line_error(r, "step 'evo' (mps.tebd)", "d = 3", "expected 2")
