"""mps.tebd's checkpoints and `qstage inspect --plot` of its outputs.

A run stopped (SIGTERM, exit 75) or killed (SIGKILL) at random instants and resumed ends with
outputs bitwise identical to an uninterrupted run, for any checkpoint interval; a resumed run goes
on from the last committed time step (the log says so); a changed parameter starts afresh; a bad
checkpoint parameter exits 2. The plot is a PNG whose heat maps show the output's values."""
import hashlib
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import DEVICE, QSTAGE, kill_and_resume_in_fresh_runs, manifest, one_line_error, read_png_rgb, run, \
    run_seconds, write_spec

# Long enough (a few seconds on 2 cores) to be stopped and killed in the middle.
LONG = "{J: 1, delta: 0.5, h: 0.1, dt: 0.05, steps: 120, measure_every: 2, trunc: {chi_max: 64, svd_min: 1.0e-10}}"


def spec(tmp, params=LONG, extra="", name="tebd", L=32):
    """A Néel state of L sites evolved by mps.tebd with `params` (a YAML map), `extra` added to it."""
    tmp.mkdir(parents=True, exist_ok=True)
    params = params[:-1] + extra + "}"
    return write_spec(tmp / f"{name}.yaml", f"""
name: tebd
steps:
  - id: psi
    stage: mps.init
    params: {{L: {L}, state: neel}}
  - id: evo
    stage: mps.tebd
    inputs: {{state: psi}}
    params: {params}
""")


def digests(run_dir):
    """sha256 of every dataset of the mps.tebd output (its bytes, dtype and shape)."""
    out = {}
    with h5py.File(Path(run_dir) / "outputs" / "evo.h5") as f:
        for name, d in f.items():
            v = np.ascontiguousarray(d[()])
            out[name] = hashlib.sha256(v.tobytes() + str((v.dtype, v.shape)).encode()).hexdigest()
    return out


def run_clean(tmp, params=LONG, extra=""):
    run_dir = tmp / "run"
    r = run(["run", spec(tmp, params, extra), "--run-dir", run_dir, "--device", DEVICE])
    assert r.code == 0, r
    return run_dir, r


def start(args):
    return subprocess.Popen([QSTAGE] + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))


def log(run_dir):
    return (Path(run_dir) / "logs" / "rank-0.log").read_text()


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    run_dir, _ = run_clean(tmp_path_factory.mktemp("clean"))
    with h5py.File(run_dir / "outputs" / "evo.h5") as f:
        assert f["times"].shape == (61,) and f["density"].shape == (61, 32)
    return run_dir


@pytest.fixture(scope="module")
def clean(clean_run):
    return digests(clean_run)


@pytest.mark.parametrize("extra", [", checkpoint_every: 1", ", checkpoint_every: 7", ""])
def test_checkpoint_intervals_give_the_bits_of_an_uninterrupted_run(clean, tmp, extra):
    run_dir, r = run_clean(tmp, LONG, extra)
    assert digests(run_dir) == clean
    assert not (run_dir / "steps" / "evo").exists(), "the step's checkpoints outlived it"


def test_a_run_checkpointed_every_interval_gives_the_same_bits(clean, tmp):
    """The time-based default: options.checkpoint_interval 0 commits after every step."""
    tmp.mkdir(parents=True, exist_ok=True)
    text = spec(tmp).read_text().replace("name: tebd\n", "name: tebd\noptions: {checkpoint_interval: 0}\n")
    s = write_spec(tmp / "interval.yaml", text)
    r = run(["run", s, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    assert digests(tmp / "run") == clean


def stop_when_committed(args, run_dir, delay):
    """Starts `qstage ARGS`, waits for the step's committed state (steps/evo/run-state.bin) to
    change, then `delay` seconds, and sends SIGTERM; returns (exit code, stderr)."""
    state = Path(run_dir) / "steps" / "evo" / "run-state.bin"
    before = state.read_bytes() if state.exists() else None
    p = start(args)
    end = time.time() + 120
    while time.time() < end and p.poll() is None and (not state.exists() or state.read_bytes() == before):
        time.sleep(0.005)
    time.sleep(delay)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    return p.returncode, err


def test_sigterm_commits_the_step_and_resume_gives_the_same_bits(clean, tmp):
    """Stopped twice (SIGTERM: the state is committed at the next time step, exit 75) and resumed:
    each resume goes on from the committed step; the outputs are the uninterrupted run's bits."""
    s = spec(tmp, LONG, ", checkpoint_every: 5")
    run_dir = tmp / "run"
    args = ["run", s, "--run-dir", run_dir, "--device", DEVICE]
    stops, resumed = [], []
    for attempt in range(6):
        code, err = stop_when_committed(args, run_dir, random.Random(attempt).uniform(0, 0.3))
        if code == 0:
            break
        assert code == 75, err
        m = re.search(r"stopped by SIGTERM in step 'evo' after (\d+) of 120 time steps \(committed\)", err)
        assert m, err
        stops.append(int(m.group(1)))
        rec = manifest(run_dir)["steps"]["evo"]
        assert rec["state"] == "stopped" and rec["committed_rows"] == stops[-1] and rec["rows_total"] == 120
        args = ["resume", run_dir, "--device", DEVICE]
    else:
        code, err = run(args).code, ""
        assert code == 0
    assert len(stops) >= 2, "the run finished before it was stopped twice"
    resumed = [int(x) for x in re.findall(r"mps.tebd: resuming after time step (\d+) of 120", log(run_dir))]
    assert resumed[:len(stops)] == stops, (resumed, stops)
    assert digests(run_dir) == clean


def test_random_sigkills_then_resume_match_a_clean_run(clean, clean_run, tmp):
    """SIGKILL at random instants (mid-update, mid-commit, between steps), `qstage resume` each
    time; the outputs equal the clean run's bit for bit, and some resume went on from a commit."""
    s = spec(tmp, LONG, ", checkpoint_every: 3")
    rng = random.Random(int(os.environ.get("QSTAGE_KILL_SEED", "20261203")))
    seconds = run_seconds(clean_run)

    def same_bits(run_dir):
        assert digests(run_dir) == clean, run_dir

    # (6 kills, each after up to a sixth of the work: a run ends after 3 of them at the soonest)
    runs = kill_and_resume_in_fresh_runs(lambda d: ["run", s, "--run-dir", d, "--device", DEVICE],
                                         [tmp / f"run{i}" for i in range(5)], 6,
                                         lambda: rng.uniform(0.1, 1.0) * seconds / 6, same_bits)
    assert any(re.search(r"resuming after time step [1-9]", log(d)) for d in runs), \
        "no kill ever landed after a commit"


def test_a_changed_parameter_does_not_reuse_the_checkpoint(tmp):
    """A run stopped after a commit, then run again with another delta: it starts from t = 0 and
    gives the bits of a clean run with that delta."""
    run_dir = tmp / "run"
    code, err = stop_when_committed(["run", spec(tmp, LONG, ", checkpoint_every: 2"), "--run-dir", run_dir,
                                     "--device", DEVICE], run_dir, 0)
    if code == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert code == 75, err
    assert (run_dir / "steps" / "evo" / "run-state.bin").exists(), "no checkpoint was committed"
    changed = LONG.replace("delta: 0.5", "delta: 0.6")
    r = run(["run", spec(tmp, changed, ", checkpoint_every: 2", name="changed"), "--run-dir", run_dir,
             "--device", DEVICE])
    assert r.code == 0, r
    assert "parameters changed: delta 0.5 -> 0.6" in r.err, r
    assert "resuming after time step" not in r.err, r
    other, _ = run_clean(tmp / "other", changed)
    assert digests(run_dir) == digests(other)


@pytest.mark.parametrize("value,fragment", [("-1", "checkpoint_every"), ("often", "checkpoint_every"),
                                            ("2.5", "checkpoint_every")])
def test_a_bad_checkpoint_parameter_exits_2(tmp, value, fragment):
    r = run(["run", spec(tmp, LONG, f", checkpoint_every: {value}"), "--run-dir", tmp / "run", "--device", DEVICE])
    one_line_error(r, fragment)
    assert not (tmp / "run" / "outputs" / "evo.h5").exists()


# ---------------------------------------------------------------- inspect --plot

VIRIDIS = np.array([(68, 1, 84), (71, 44, 122), (59, 81, 139), (44, 113, 142), (33, 144, 141), (39, 173, 129),
                    (92, 200, 99), (170, 220, 50), (253, 231, 37)], float)


def viridis(x):
    """stages/mps/views.cpp's colour map: nine stops, linear between them."""
    x = min(max(x, 0.0), 1.0)
    s = x * 8
    i = min(int(s), 7)
    return VIRIDIS[i] + (s - i) * (VIRIDIS[i + 1] - VIRIDIS[i])


# stages/mps/views.cpp's geometry: heat maps kMapWidth = 360 wide from x = 90 (density) and 530
# (entropy), time upwards from y = 560 (t = 0) to y = 80 (the last time).
TOP, BOTTOM, WIDTH, DENSITY, ENTROPY = 80, 560, 360, 90, 530


def test_inspect_plots_densities_and_entropies_against_time(tmp):
    run_dir, _ = run_clean(tmp, "{delta: 0.5, dt: 0.1, steps: 20, measure_every: 2}")
    out = run_dir / "outputs" / "evo.h5"
    png = tmp / "evo.png"
    r = run(["inspect", out, "--plot", png])
    assert r.code == 0 and f"wrote {png}" in r.out, r
    img = read_png_rgb(png).astype(float)
    assert img.shape == (720, 1280, 3)
    with h5py.File(out) as f:
        times, n, s = f["times"][()], f["density"][()], f["entropy_vN"][()]
    L = n.shape[1]
    assert L == 32 and s.shape == (11, 31)

    def pixel(left, cols, col, y):
        return img[y, left + int((col + 0.5) * WIDTH / cols)]

    # Every cell's colour at the first and the last time (the bottom and top pixel rows).
    for y, k in ((BOTTOM, 0), (TOP, len(times) - 1)):
        for j in range(L):
            want = viridis((n[k, j] - n.min()) / (n.max() - n.min()))
            assert np.abs(pixel(DENSITY, L, j, y) - want).max() <= 1, (y, j)
        for b in range(L - 1):
            want = viridis(s[k, b] / s.max())
            assert np.abs(pixel(ENTROPY, L - 1, b, y) - want).max() <= 1, (y, b)
    # The Néel start: occupied and empty sites alternate; no entanglement at t = 0.
    assert (pixel(DENSITY, L, 0, BOTTOM) == VIRIDIS[-1]).all() and (pixel(DENSITY, L, 1, BOTTOM) == VIRIDIS[0]).all()
    # The half-chain entropy's curve (blue) rises from the bottom left to the top right.
    curve = np.argwhere(np.all(img[TOP:BOTTOM, 980:1252] == (31, 119, 180), axis=2))
    assert len(curve) > 100
    left, right = curve[curve[:, 1] < 20], curve[curve[:, 1] > 250]
    assert left[:, 0].min() > right[:, 0].max(), "S(t) at bond L/2 does not grow"


def test_inspect_plot_refuses_files_without_a_time_series(tmp):
    run_dir, _ = run_clean(tmp, "{dt: 0.1, steps: 2}")
    r = run(["inspect", run_dir / "outputs" / "psi.h5", "--plot", tmp / "psi.png"])
    one_line_error(r, "psi.h5", "is not a", "mps.tebd")
    assert not (tmp / "psi.png").exists()
    fake = tmp / "fake.h5"
    with h5py.File(fake, "w") as f:
        f.attrs["qstage.stage"] = "mps.tebd"
        f["times"] = np.zeros(3)
    r = run(["inspect", fake, "--plot", tmp / "fake.png"])
    one_line_error(r, "fake.h5", "'density'", "time series")
    assert not (tmp / "fake.png").exists()
