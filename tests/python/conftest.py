"""Fixtures for the end-to-end tests: they drive the `qstage` binary (QSTAGE_BIN) and check its
files with h5py and numpy."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

QSTAGE = os.environ.get("QSTAGE_BIN", "qstage")
# cpu in CI; the GPU machine runs the same tests with QSTAGE_TEST_DEVICE=cuda.
DEVICE = os.environ.get("QSTAGE_TEST_DEVICE", "cpu")
ROOT = Path(__file__).resolve().parents[2]


def mpirun_prefix(n):
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip("mpirun not found")
    # --oversubscribe: CI machines have 2 cores; root is allowed because containers run as root;
    # --bind-to none: OpenMPI binds each rank to one core when -np is 1 or 2 (qstage warns).
    return [exe, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", str(n)]


class Result:
    def __init__(self, proc):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def __repr__(self):
        return f"exit {self.code}\nstdout:\n{self.out}\nstderr:\n{self.err}"


def run(args, cwd=None, mpi=0, timeout=600, env=None):
    cmd = (mpirun_prefix(mpi) if mpi else []) + [QSTAGE] + [str(a) for a in args]
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "2")
    if env:
        e.update(env)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e)
    return Result(proc)


def sigterm_mpi_run(n, args, committed, timeout=300):
    """Runs qstage ARGS on n ranks and, once the file `committed` exists (a step's first commit),
    sends every rank SIGTERM, as srun does on preemption; returns (exit code, stderr)."""
    p = subprocess.Popen(mpirun_prefix(n) + [QSTAGE] + [str(a) for a in args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    end = time.time() + timeout
    while time.time() < end and p.poll() is None and not Path(committed).exists():
        time.sleep(0.002)
    for pid in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split():
        os.kill(int(pid), signal.SIGTERM)
    _, err = p.communicate(timeout=timeout)
    return p.returncode, err


def chain_spec(name, rows, cols, out_cols, seed, options, chunk_rows=None):
    """The workflow most end-to-end tests use: a random psi (rows x cols, complex64), a random
    gate (cols x out_cols), applied = psi . gate, and the stats of applied."""
    chunk = f", chunk_rows: {chunk_rows}" if chunk_rows else ""
    return f"""
name: {name}
options: {options}
steps:
  - id: psi
    stage: tensor.random
    params: {{shape: [{rows}, {cols}], dtype: complex64, seed: {seed}{chunk}}}
  - id: gate
    stage: tensor.random
    params: {{shape: [{cols}, {out_cols}], dtype: complex64, seed: {seed + 1}}}
  - id: applied
    stage: tensor.matmul
    inputs: {{a: psi, b: gate}}
  - id: summary
    stage: tensor.stats
    inputs: {{x: applied}}
"""


def stop_once_checkpointed(spec, run_dir, journal):
    """Starts `qstage run SPEC`, sends SIGTERM as soon as `journal` (a step's first checkpoint)
    exists, and checks that the run stopped with exit 75; skips if it finished first."""
    p = subprocess.Popen([QSTAGE, "run", str(spec), "--run-dir", str(run_dir), "--device", DEVICE],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="2"))
    end = time.time() + 120
    while time.time() < end and not Path(journal).exists() and p.poll() is None:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    if p.returncode == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert p.returncode == 75, err


def stop_then_resume(spec, run_dir, step):
    """stop_once_checkpointed on `step`, then `qstage resume`, which must continue from a commit;
    returns the resume's result."""
    stop_once_checkpointed(spec, run_dir, Path(run_dir) / "steps" / step / "journal.json")
    assert manifest(run_dir)["steps"][step]["state"] == "stopped"
    r = run(["resume", run_dir, "--device", DEVICE])
    assert r.code == 0, r
    assert "resuming at row" in r.err
    return r


def kill_and_resume(args, run_dir, kills, delay, cwd=None):
    """Runs `qstage ARGS` and SIGKILLs it delay() seconds after it is under way (its log has grown:
    start-up, which differs between machines and devices, is not part of the delay), up to `kills`
    times, going on with `qstage resume RUN_DIR` once the run directory has a manifest; the attempt
    after the last kill must finish (exit 0), and an attempt that finishes sooner ends it. Returns
    the kills. Give delays as fractions of the work (run_seconds of a clean run), not as fixed
    seconds, so that the kills land within the run on a fast machine and a slow one alike."""
    done = 0
    log = Path(run_dir) / "logs" / "rank-0.log"
    while True:
        logged = log.stat().st_size if log.exists() else 0
        p = subprocess.Popen([QSTAGE] + [str(a) for a in args], cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
        try:
            if done < kills:
                end = time.time() + 120
                while time.time() < end and (not log.exists() or log.stat().st_size <= logged) and p.poll() is None:
                    time.sleep(0.005)
            _, err = p.communicate(timeout=delay() if done < kills else 600)
            assert p.returncode == 0, err
            return done
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            done += 1
            if (Path(run_dir) / "manifest.json").exists():
                args = ["resume", run_dir, "--device", DEVICE]


def kill_and_resume_in_fresh_runs(args_of, run_dirs, kills, delay, check, cwd=None):
    """kill_and_resume in fresh run directories (taken from `run_dirs` in turn; args_of(run_dir)
    gives the command) until `kills` kills have landed in all; check(run_dir) after each finished
    run. The delays come from a clean run timed under another load (CI runs tests side by side), so
    a run that finished before its kills halves the delays of the next. Returns the directories."""
    done, scale, used = 0, 1.0, []
    for run_dir in run_dirs:
        done += kill_and_resume(args_of(run_dir), run_dir, kills - done, lambda: scale * delay(), cwd)
        check(run_dir)
        used.append(run_dir)
        if done >= kills:
            return used
        scale /= 2
    raise AssertionError(f"{done} of {kills} kills landed in {len(used)} runs, each finished sooner")


def run_seconds(run_dir):
    """The seconds a finished run's steps took (the manifest's wall_seconds, start-up excluded)."""
    return sum(step["wall_seconds"] for step in manifest(run_dir)["steps"].values())


def read_png_rgb(path):
    """Decodes the 8-bit RGB, unfiltered PNG that qstage writes (io/png.hpp) into an array."""
    import struct
    import zlib

    import numpy as np
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
            assert body[8:10] == b"\x08\x02"  # 8-bit RGB
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height = size
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + 3 * width)
    assert (rows[:, 0] == 0).all(), "rows are stored unfiltered"
    return rows[:, 1:].reshape(height, width, 3)


def one_line_error(r, *fragments):
    """Bad input: exit 2 and one line 'qstage: error: ...' on stderr holding every fragment;
    returns that line."""
    assert r.code == 2, r
    lines = [l for l in r.err.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("qstage: error: ")]
    assert len(errors) == 1, r
    for f in fragments:
        assert f in errors[0], (f, errors[0])
    return errors[0]


def write_spec(path, text):
    path = Path(path)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def committed_run(tmp, text, device=None):
    """Writes `text` as tmp/spec.yaml and runs it into tmp/run; returns (spec, run_dir)."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp / "spec.yaml", text)
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", device or DEVICE])
    assert r.code == 0, r
    return spec, tmp / "run"


def file_digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_digest(root):
    """Digest of every file under root (names and bytes): 'nothing was touched' checks."""
    h = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            h[str(p.relative_to(root))] = file_digest(p)
    return h


def manifest(run_dir):
    return json.loads((Path(run_dir) / "manifest.json").read_text())


def checksums(run_dir):
    """step -> dataset -> qsum64, from the manifest."""
    return {k: v.get("checksums") for k, v in manifest(run_dir)["steps"].items() if v.get("state") == "done"}


@pytest.fixture
def qstage():
    return run


@pytest.fixture
def tmp(tmp_path):
    return tmp_path
