"""MPI: an odd rank count (3) writes and reads chunked datasets collectively (segments, merge,
streamed inputs) and gets the checksums of a 1-rank run; SIGTERM under mpirun stops all ranks at
a batch boundary with exit 75, and a resume with another rank count finishes identically."""
import os
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import oracle
from conftest import DEVICE, committed_run, chain_spec, QSTAGE, checksums, manifest, mpirun_prefix, run, write_spec

SPEC = chain_spec("mpi", 50000, 24, 12, 21, "{device_memory: 32MiB, max_batch_rows: 700, checkpoint_interval: 0}", 700)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    spec, run_dir = committed_run(tmp_path_factory.mktemp("single"), SPEC)
    return spec, checksums(run_dir)


def test_three_ranks_match_one_rank(single, tmp):
    spec, want = single
    r = run(["run", spec, "--run-dir", tmp / "run3", "--device", DEVICE], mpi=3)
    assert r.code == 0, r
    assert "3 ranks" in r.err
    assert checksums(tmp / "run3") == want
    # The collectively written, merged file holds exactly what the oracle says.
    with h5py.File(tmp / "run3" / "outputs" / "psi.h5") as f:
        np.testing.assert_array_equal(f["data"][...], oracle.random_tensor((50000, 24), np.complex64, 21))
        assert f.attrs["qstage.ranks"] == 3
    # Every rank wrote its own log.
    assert sorted(p.name for p in (tmp / "run3" / "logs").iterdir()) == ["rank-0.log", "rank-1.log", "rank-2.log"]


# mpirun forwards a signal with a delay of up to a second: the signal tests need a longer job.
BIG = SPEC.replace("[50000, 24]", "[1000000, 24]").replace("name: mpi", "name: mpibig")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    spec, run_dir = committed_run(tmp_path_factory.mktemp("big"), BIG)
    return spec, checksums(run_dir)


def start_mpirun(spec, run_dir, ranks):
    cmd = mpirun_prefix(ranks) + [QSTAGE, "run", str(spec), "--run-dir", str(run_dir), "--device", DEVICE]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    journal = run_dir / "steps" / "psi" / "journal.json"
    end = time.time() + 120
    while time.time() < end and not journal.exists() and p.poll() is None:
        time.sleep(0.02)
    return p


def test_sigterm_to_the_ranks_stops_all_with_75_and_resume_with_other_rank_count(big, tmp):
    """What srun does on preemption: every task gets SIGTERM; mpirun passes on their 75."""
    spec, want = big
    run_dir = tmp / "run"
    p = start_mpirun(spec, run_dir, 2)
    ranks = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    for pid in ranks:
        os.kill(int(pid), signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    if p.returncode == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert p.returncode == 75, err
    assert run(["status", run_dir, "--exit-code"]).code == 75
    r = run(["resume", run_dir, "--device", DEVICE], mpi=3)
    assert r.code == 0, r
    assert checksums(run_dir) == want
    assert run(["status", run_dir, "--exit-code"]).code == 0


def test_sigterm_to_mpirun_leaves_a_resumable_run(big, tmp):
    """mpirun forwards SIGTERM to the ranks but reports its own exit code (1); the run directory
    says the truth: `qstage status --exit-code` gives 75, and resume completes it."""
    spec, want = big
    run_dir = tmp / "run"
    p = start_mpirun(spec, run_dir, 2)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    if p.returncode == 0 or run(["status", run_dir, "--exit-code"]).code == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert "stop requested" in err, err
    assert run(["status", run_dir, "--exit-code"]).code == 75
    r = run(["resume", run_dir, "--device", DEVICE], mpi=2)
    assert r.code == 0, r
    assert checksums(run_dir) == want


def test_tn_contract_reusing_invariant_steps_matches_one_rank_bit_for_bit(tmp):
    """tn.contract deals its (bitstring, slice) rows to ranks; every rank runs the prologue (the
    invariant steps) for each bitstring it meets and keeps its results for that bitstring's
    slices. The amplitudes are bitwise those of one rank, with reuse or without."""
    from test_tn import REUSE_BITS, REUSE_SOURCE, reuse_spec
    spec = reuse_spec(REUSE_SOURCE, REUSE_BITS, "128KiB")
    _, one = committed_run(tmp / "one", spec)
    r = run(["run", tmp / "one" / "spec.yaml", "--run-dir", tmp / "three", "--device", DEVICE], mpi=3)
    assert r.code == 0, r
    for step in ("amps", "amps_plain"):
        with h5py.File(one / "outputs" / f"{step}.h5") as f, h5py.File(tmp / "three" / "outputs" / f"{step}.h5") as g:
            assert f["amplitudes"][()].tobytes() == g["amplitudes"][()].tobytes()
            assert g.attrs["qstage.ranks"] == 3
            if step == "amps":
                # Once per bitstring per rank at most, and each rank runs at least one.
                assert 3 <= g.attrs["prologue_runs"] <= 3 * 3 and 1 <= f.attrs["prologue_runs"] <= 3
            else:
                assert g.attrs["prologue_runs"] == 0
