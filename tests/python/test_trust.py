"""What a user trusts: every stage stops at its next safe point on SIGTERM (exit 75, resume with
the same bits); damaged segments, journals and outputs are found before they are trusted, and
recomputed; one run at a time holds a run directory; a step's bad input found while it runs
leaves the run directory's spec as it was; a kill at the N-th rename or fsync of a commit
resumes to the same bits."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import DEVICE, QSTAGE, chain_spec, checksums, committed_run, manifest, mpirun_prefix, one_line_error, \
    run, write_spec

DATA = Path(__file__).resolve().parents[1] / "data" / "fcidump"

# A chain of four steps whose matmul commits many segments (a commit after every batch).
CHAIN = chain_spec("trust", 120000, 32, 32, 5, "{device_memory: 32MiB, max_batch_rows: 1024, checkpoint_interval: 0}",
                   1024)


def data_digests(run_dir):
    """sha256 of every dataset's bytes in every output, read with h5py (groups included)."""
    out = {}
    for f in sorted((Path(run_dir) / "outputs").glob("*.h5")):
        with h5py.File(f) as h:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    out[f"{f.stem}/{name}"] = hashlib.sha256(np.ascontiguousarray(obj[()]).tobytes()).hexdigest()
            h.visititems(visit)
    return out


def start(args, cwd=None, mpi=0, env=None):
    prefix = mpirun_prefix(mpi) if mpi else []
    e = dict(os.environ, OMP_NUM_THREADS="2")
    e.update(env or {})
    return subprocess.Popen(prefix + [QSTAGE] + [str(a) for a in args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=e)


def wait_for(predicate, p, timeout=120):
    end = time.time() + timeout
    while time.time() < end and p.poll() is None:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def stop_when(p, predicate, mpi=0):
    """SIGTERM to the run (every rank under mpirun) once predicate() holds; returns (code, stderr)."""
    assert wait_for(predicate, p), "the run ended before the moment to stop it"
    if mpi:
        for pid in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGTERM)
    else:
        p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=600)
    return p.returncode, err


@pytest.fixture(scope="module")
def clean_chain(tmp_path_factory):
    spec, run_dir = committed_run(tmp_path_factory.mktemp("clean"), CHAIN)
    return data_digests(run_dir), checksums(run_dir)


def stopped_chain(tmp):
    """The chain stopped (SIGTERM) after its matmul committed at least three segments."""
    spec = write_spec(tmp / "spec.yaml", CHAIN)
    run_dir = tmp / "run"
    work = run_dir / "steps" / "applied"
    p = start(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
    code, err = stop_when(p, lambda: len(list(work.glob("seg-*.h5"))) >= 3)
    if code == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert code == 75, err
    journal = json.loads((work / "journal.json").read_text())
    assert len(journal["segments"]) >= 3
    return run_dir, work, journal


def resume(run_dir):
    r = run(["resume", run_dir, "--device", DEVICE])
    assert r.code == 0, r
    return r


# ---------------------------------------------------------------- stops at every stage's safe point

def test_sci_solve_stops_between_passes_and_resumes_to_the_same_bits(tmp):
    """The stop is taken at the next safe point: a pass boundary, or the end of a unit of host work
    (a Davidson product, a selection on resident data); each commits at checkpoint_interval 0, so
    the state exists from the first."""
    params = "eps_var: 5.0e-4, eps_pt2: 1.0e-5, max_new_dets: 600, max_iterations: 8, davidson_tolerance: 1.0e-7"
    clean = committed_run(tmp / "clean", sci_text(tmp / "clean", params))[1]
    spec = write_spec(tmp / "spec.yaml", sci_text(tmp, params, "{checkpoint_interval: 0}"))
    run_dir = tmp / "run"
    p = start(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
    code, err = stop_when(p, lambda: (run_dir / "steps" / "sci" / "run-state.bin").exists())
    assert code == 75, err
    assert "stopped by SIGTERM in step 'sci' after" in err and "qstage resume" in err, err
    assert manifest(run_dir)["steps"]["sci"]["state"] == "stopped"
    r = resume(run_dir)
    assert "resumed from the state an earlier run committed" in r.err
    assert data_digests(run_dir) == data_digests(clean)


@pytest.mark.parametrize("damage", ["a flipped byte of the state", "the state cut short", "a flipped byte of the header"])
def test_a_damaged_run_state_is_discarded_and_the_step_starts_again(tmp, damage):
    """The step's committed run state (steps/<id>/run-state.bin: a header with its own hash, the
    state's size and hash, then the state) damaged while the run was stopped: one warning line,
    the step's run starts again, and the output has the bits of a clean run."""
    params = "eps_var: 5.0e-4, eps_pt2: 1.0e-5, max_new_dets: 600, max_iterations: 8, davidson_tolerance: 1.0e-7"
    clean = committed_run(tmp / "clean", sci_text(tmp / "clean", params))[1]
    spec = write_spec(tmp / "spec.yaml", sci_text(tmp, params, "{checkpoint_interval: 0}"))
    run_dir = tmp / "run"
    state = run_dir / "steps" / "sci" / "run-state.bin"
    p = start(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
    code, err = stop_when(p, lambda: state.exists())
    assert code == 75, err
    data = bytearray(state.read_bytes())
    header_end = data.index(b"\n", data.index(b"\n") + 1) + 1
    if damage == "a flipped byte of the state":
        data[-1] ^= 0x40
    elif damage == "the state cut short":
        data = data[:header_end + (len(data) - header_end) // 2]
    else:
        data[header_end - 10] ^= 0x01
    state.write_bytes(bytes(data))
    r = resume(run_dir)
    assert "discarding unreadable" in r.err and "run-state.bin" in r.err, r.err
    assert "resumed from the state an earlier run committed" not in r.err, r.err
    assert data_digests(run_dir) == data_digests(clean)


def test_sci_solve_stops_on_three_ranks(tmp):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found")
    params = "eps_var: 5.0e-4, eps_pt2: 1.0e-5, max_new_dets: 600, max_iterations: 8, davidson_tolerance: 1.0e-7"
    clean = committed_run(tmp / "clean", sci_text(tmp / "clean", params))[1]
    # (each rank runs its selections on resident data as units of host work, whose state is
    # committed at the checkpoint interval: 0 commits after every unit, so there is one to stop at)
    spec = write_spec(tmp / "spec.yaml", sci_text(tmp, params, "{checkpoint_interval: 0}"))
    run_dir = tmp / "run"
    p = start(["run", spec, "--run-dir", run_dir, "--device", DEVICE], mpi=3, env={"OMP_NUM_THREADS": "1"})
    code, err = stop_when(p, lambda: (run_dir / "steps" / "sci" / "run-state.bin").exists(), mpi=3)
    # mpirun answers 1 for a SIGTERM it saw; the run directory says how the run ended
    if code == 1:
        code = run(["status", run_dir, "--exit-code"]).code
    assert code == 75, err
    resume(run_dir)
    assert data_digests(run_dir) == data_digests(clean)


def sci_text(folder, params, options="{}"):
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA / "N2_sto6g_FCIDUMP", folder / "N2_sto6g_FCIDUMP")
    return f"""
name: sci
options: {options}
steps:
  - id: sci
    stage: sci.solve
    params: {{fcidump: N2_sto6g_FCIDUMP, {params}}}
"""


STATEVECTOR = """
name: sv
steps:
  - id: sv
    stage: tn.statevector
    params:
      random: {rows: 4, cols: 6, cycles: 24, seed: 3}
      random_bitstrings: {count: 8, seed: 4}
"""


def test_statevector_stops_between_gates_with_its_state_committed(tmp):
    clean = committed_run(tmp / "clean", STATEVECTOR)[1]
    spec = write_spec(tmp / "spec.yaml", STATEVECTOR)
    run_dir = tmp / "run"
    p = start(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
    code, err = stop_when(p, lambda: (run_dir / "steps" / "sv").exists())
    assert code == 75, err
    assert "stopped by SIGTERM in step 'sv' after gate" in err, err
    meta = json.loads((run_dir / "steps" / "sv" / "stage-statevector.json").read_text())
    assert 0 < meta["gates"]
    r = resume(run_dir)
    assert f"resuming after gate {meta['gates']} of" in r.err
    assert data_digests(run_dir) == data_digests(clean)


# ---------------------------------------------------------------- damaged files

def flip_chunk_bytes(path, dataset, at=16, count=4):
    """Flips `count` bytes inside the first stored chunk of `dataset` (its data, not HDF5's metadata)."""
    with h5py.File(path) as f:
        offset = f[dataset].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(offset + at)
        data = bytearray(fh.read(count))
        fh.seek(offset + at)
        fh.write(bytes(b ^ 0xFF for b in data))


def test_a_segment_with_flipped_bytes_is_recomputed(clean_chain, tmp):
    run_dir, work, journal = stopped_chain(tmp)
    bad = journal["segments"][1]
    flip_chunk_bytes(work / bad["file"], "/data")
    r = resume(run_dir)
    assert f"segment {bad['file']}" in r.err and "do not match their checksum" in r.err, r.err
    assert f"recomputing rows [{bad['rows'][0]}," in r.err
    assert data_digests(run_dir) == clean_chain[0]
    assert checksums(run_dir) == clean_chain[1]


def test_a_truncated_segment_is_recomputed(clean_chain, tmp):
    run_dir, work, journal = stopped_chain(tmp)
    seg = work / journal["segments"][-1]["file"]
    os.truncate(seg, seg.stat().st_size // 2)
    resume(run_dir)
    assert data_digests(run_dir) == clean_chain[0]


def test_an_edited_journal_is_discarded(clean_chain, tmp):
    run_dir, work, journal = stopped_chain(tmp)
    edited = dict(journal, committed_rows=journal["committed_rows"] + 1024)
    (work / "journal.json").write_text(json.dumps(edited))
    r = resume(run_dir)
    assert "does not match its own hash" in r.err, r.err
    assert data_digests(run_dir) == clean_chain[0]


def test_a_journal_without_a_hash_is_still_checked_against_its_segments(clean_chain, tmp):
    """A journal of the older format (no hash of its own) whose committed_rows its segments do
    not hold: found by the consistency check."""
    run_dir, work, journal = stopped_chain(tmp)
    edited = dict(journal, committed_rows=journal["committed_rows"] + 1024)
    del edited["hash"]
    edited["format"] = "qstage-journal-1"
    (work / "journal.json").write_text(json.dumps(edited))
    r = resume(run_dir)
    assert "inconsistent" in r.err and "committed_rows" in r.err, r.err
    assert data_digests(run_dir) == clean_chain[0]


def test_a_damaged_output_is_found_and_recomputed(clean_chain, tmp):
    spec, run_dir = committed_run(tmp, CHAIN)
    out = run_dir / "outputs" / "applied.h5"
    os.truncate(out, out.stat().st_size - 4096)
    st = run(["status", run_dir, "--exit-code"])
    assert st.code == 75 and "damaged" in st.out, st
    r = run(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
    assert r.code == 0, r
    assert "step 'applied': its output" in r.err and "recomputing it" in r.err, r.err
    assert "step 'summary' (tensor.stats): up to date" in r.err  # the same data: later steps keep their keys
    assert data_digests(run_dir) == clean_chain[0]
    assert run(["status", run_dir, "--exit-code"]).code == 0


def test_inspect_verify_recomputes_checksums(tmp):
    spec, run_dir = committed_run(tmp, CHAIN)
    out = run_dir / "outputs" / "applied.h5"
    r = run(["inspect", out, "--verify"])
    assert r.code == 0 and "every checksum matches the data" in r.out, r
    flip_chunk_bytes(out, "/data")
    r = run(["inspect", out, "--verify", "--json"])
    assert r.code == 3, r
    report = json.loads(r.out)
    assert not report["ok"] and report["datasets"][0]["status"] == "MISMATCH"


def test_inspect_verify_checks_compressed_chunks(tmp):
    text = CHAIN.replace("  - id: summary", "  - id: packed\n    stage: compress\n    inputs: {x: applied}\n"
                                             "    params: {error: 1.0e-3}\n  - id: summary")
    spec, run_dir = committed_run(tmp, text)
    out = run_dir / "outputs" / "packed.h5"
    r = run(["inspect", out, "--verify", "--json"])
    assert r.code == 0, r
    statuses = {d["dataset"]: (d["status"], d.get("attribute")) for d in json.loads(r.out)["datasets"]}
    assert ("ok", "stored_xxh64") in statuses.values(), statuses
    with h5py.File(out) as f:
        name = next(k for k, d in f.items() if "stored_xxh64" in d.attrs)
    flip_chunk_bytes(out, "/" + name, at=40)
    assert run(["inspect", out, "--verify"]).code == 3


# ---------------------------------------------------------------- one run at a time

def test_a_second_run_on_a_busy_directory_exits_2_naming_the_holder(clean_chain, tmp):
    spec = write_spec(tmp / "spec.yaml", CHAIN)
    run_dir = tmp / "run"
    p = start(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
    try:
        assert wait_for(lambda: (run_dir / "steps" / "applied" / "journal.json").exists(), p)
        p.send_signal(signal.SIGSTOP)  # (held still, lock and all, however fast the machine)
        before = (run_dir / "manifest.json").read_bytes(), (run_dir / "spec.yaml").read_bytes()
        for command in (["run", spec, "--run-dir", run_dir], ["resume", run_dir]):
            line = one_line_error(run(command + ["--device", DEVICE]), "is in use by pid", f"pid {p.pid} on host")
            assert "one run at a time" in line
        assert ((run_dir / "manifest.json").read_bytes(), (run_dir / "spec.yaml").read_bytes()) == before
        assert p.poll() is None, "the first run must go on"
    finally:
        p.send_signal(signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    assert p.returncode in (0, 75), err
    resume(run_dir)  # the lock went with the process
    assert data_digests(run_dir) == clean_chain[0]


def test_a_killed_holder_releases_the_lock(tmp):
    spec = write_spec(tmp / "spec.yaml", CHAIN)
    run_dir = tmp / "run"
    p = start(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
    assert wait_for(lambda: (run_dir / "steps" / "applied" / "journal.json").exists(), p)
    p.kill()
    p.communicate()
    resume(run_dir)


def test_an_unwritable_run_directory_is_bad_input(tmp):
    spec = write_spec(tmp / "spec.yaml", CHAIN)
    one_line_error(run(["run", spec, "--run-dir", "/proc/qstage-run", "--device", DEVICE]),
                   "cannot create run directory '/proc/qstage-run'", "expected a directory qstage may write")


# ---------------------------------------------------------------- bad input found while a step runs

def test_bad_input_found_while_a_step_runs_keeps_the_accepted_spec(tmp):
    good = CHAIN
    spec, run_dir = committed_run(tmp, good)
    before_spec = (run_dir / "spec.yaml").read_bytes()
    before = manifest(run_dir)
    outputs = {p.name: p.read_bytes() for p in (run_dir / "outputs").iterdir()}
    # A circuit file whose gate is unknown: found when tn.build reads it, while the step runs.
    (tmp / "bad.qasm").write_text('OPENQASM 2.0;\ninclude "qelib1.inc";\nqreg q[2];\nfrobnicate q[0];\n')
    bad = write_spec(tmp / "bad.yaml", good.replace("name: trust", "name: trust") +
                     "  - id: net\n    stage: tn.build\n    params: {circuit: bad.qasm, bitstrings: ['00']}\n")
    r = run(["run", bad, "--run-dir", run_dir, "--device", DEVICE])
    one_line_error(r, "step 'net' (tn.build)")
    assert (run_dir / "spec.yaml").read_bytes() == before_spec
    after = manifest(run_dir)
    for field in ("spec_source", "spec_dir", "qstage_version", "steps"):
        assert after.get(field) == before.get(field), field
    assert {p.name: p.read_bytes() for p in (run_dir / "outputs").iterdir()} == outputs
    r = resume(run_dir)
    assert "net" not in r.err and "up to date" in r.err


# ---------------------------------------------------------------- kills at the N-th rename and fsync

@pytest.mark.parametrize("calls", ["rename,renameat,renameat2", "fsync,fdatasync"])
def test_kills_injected_at_commits_resume_to_the_same_bits(clean_chain, tmp, calls):
    """strace kills the run at its N-th rename (or fsync), for N spread over all the run makes:
    inside the matmul's commits, at outputs' commits, at manifest updates between steps, at the
    very last; each killed run is resumed and must end with the clean run's bits."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace not found (fault injection needs it)")
    spec = write_spec(tmp / "spec.yaml", CHAIN)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    count = subprocess.run([strace, "-f", "-c", "-o", tmp / "count.txt", "-e", f"trace={calls}", QSTAGE, "run", spec,
                            "--run-dir", tmp / "count", "--device", DEVICE], capture_output=True, text=True, env=env)
    assert count.returncode == 0, count.stderr
    total = int((tmp / "count.txt").read_text().split("\n")[-2].split()[3])  # the summary line: its calls
    assert total > 100, total
    points = sorted({1, 2, 3, total // 10, total // 3, total // 2, 2 * total // 3, total - 6, total - 3, total - 1, total})
    kills = 0
    for n in points:
        run_dir = tmp / f"run-{n}"
        p = subprocess.run([strace, "-f", "-o", "/dev/null", "-e", f"trace={calls}", "-e",
                            f"inject={calls}:signal=KILL:when={n}", QSTAGE, "run", spec, "--run-dir", run_dir,
                            "--device", DEVICE], capture_output=True, text=True, timeout=600, env=env)
        if p.returncode == 0:
            continue  # the run made fewer such calls this time
        assert p.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), p.stderr
        kills += 1
        args = ["resume", run_dir] if (run_dir / "manifest.json").exists() else ["run", spec, "--run-dir", run_dir]
        r = run(args + ["--device", DEVICE])
        assert r.code == 0, (n, r)
        assert data_digests(run_dir) == clean_chain[0], n
        assert checksums(run_dir) == clean_chain[1], n
    assert kills >= len(points) - 2, (kills, points)
