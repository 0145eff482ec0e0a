"""keys.dedup against numpy.unique (return_inverse, return_counts) on skewed keys with heavy
duplication: 1- and 2-word keys, 1 and 3 ranks, in core, with a device budget far below the data
(the records in host memory) and with both budgets far below it (the passes, through files),
stopped and resumed (also on another rank count), and its bad inputs.

Value sums: keys.dedup sums each key's values within a tile (tile_rows rows, in input order),
then those tile sums in tile order, each sum pairwise in a shape fixed by its number of terms. np.add.at sums in input order across the whole input, which
rounds differently, so against it the check is to 1e-12 (relative to the sum of |values|); the
exact check is against a numpy reimplementation of that order (tile_sums below), and every run
of the same input must give the same bytes whatever the ranks, budget and stops."""
import re
import shutil

import h5py
import numpy as np
import pytest

from conftest import (DEVICE, committed_run, manifest, run, sigterm_mpi_run, stop_once_checkpointed, stop_then_resume,
                      write_spec, one_line_error)

# On cuda each batch carries CUB's fixed temporary storage (kernels/keys/sort_unique.hpp, 64 KiB), so
# "a device budget an eighth of the data" needs more data there to leave a batch room.
N = 600000 if DEVICE == "cuda" else 60000
TILE = 512


def skewed_keys(words, seed=7):
    rng = np.random.default_rng(seed)
    keys = np.zeros((N, words), dtype=np.uint64)
    zipf = np.minimum(rng.zipf(1.3, size=(N, words)), 5000).astype(np.uint64)
    keys[:] = zipf * np.uint64(0x9E3779B97F4A7C15)  # spread over the 64 bits (high bits set too)
    hot = rng.random(N) < 0.5  # one key is half the data
    keys[hot] = np.uint64(0xFFFF_FFFF_0000_0001)
    values = rng.standard_normal(N) * np.exp(rng.uniform(-20, 20, N))
    return (keys[:, 0].copy() if words == 1 else keys), values


def as_rows(keys):
    """Keys as one sortable scalar per row, lexicographic over the words (word 0 first)."""
    if keys.ndim == 1:
        return keys
    k = np.ascontiguousarray(keys.astype(">u8"))  # big-endian bytes sort like the words
    return k.view(np.dtype((np.void, 8 * keys.shape[1]))).ravel()


def pairwise(terms):
    """kernels/keys/sort_unique.hpp's PairwiseSum: complete binary trees by the binary digits of the
    number of terms (largest first), folded from the right."""
    n = len(terms)
    if n == 0:
        return 0.0
    if n & (n - 1) == 0:  # a complete tree: its halves, added
        return terms[0] if n == 1 else pairwise(terms[:n // 2]) + pairwise(terms[n // 2:])
    head = 1 << (n.bit_length() - 1)
    return pairwise(terms[:head]) + pairwise(terms[head:])


def tile_sums(inverse, values, unique, tile):
    """The per-key sum keys.dedup computes: within a tile in input order, then tiles in order,
    each sum pairwise."""
    per_key = [[] for _ in range(unique)]
    for t in range(0, len(values), tile):
        inv, val = inverse[t:t + tile], values[t:t + tile]
        order = np.argsort(inv, kind="stable")  # each key's rows of the tile, in input order
        keys_here, starts = np.unique(inv[order], return_index=True)
        bounds = list(starts[1:]) + [len(order)]
        for k, s, e in zip(keys_here, starts, bounds):
            per_key[k].append(pairwise([float(x) for x in val[order[s:e]]]))
    return np.array([pairwise(p) for p in per_key])


def spec_text(params="", options="{}", values=True):
    inputs = "{keys: {file: in.h5, dataset: keys}" + (", values: {file: in.h5, dataset: values}" if values else "") + "}"
    return f"""
name: dedup
options: {options}
steps:
  - id: unique
    stage: keys.dedup
    inputs: {inputs}
    params: {{tile_rows: {TILE}{params}}}
"""


def make_input(tmp, words):
    keys, values = skewed_keys(words)
    tmp.mkdir(parents=True, exist_ok=True)
    with h5py.File(tmp / "in.h5", "w") as f:
        f.create_dataset("keys", data=keys, chunks=(4096,) + keys.shape[1:])
        f.create_dataset("values", data=values)
    return keys, values


def outputs(run_dir):
    with h5py.File(run_dir / "outputs" / "unique.h5", "r") as f:
        return {k: f[k][...] for k in ("keys", "counts", "values", "index")}, int(f.attrs["tile_rows"])


def check_against_numpy(got, keys, values):
    rows = as_rows(keys)
    u, first, inverse, counts = np.unique(rows, return_index=True, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    np.testing.assert_array_equal(got["keys"], keys[first])  # ascending, lexicographic
    assert got["keys"].shape == (len(u),) + keys.shape[1:]
    np.testing.assert_array_equal(got["counts"], counts)
    np.testing.assert_array_equal(got["index"], inverse)
    by_rows = np.zeros(len(u))
    np.add.at(by_rows, inverse, values)
    scale = np.zeros(len(u))
    np.add.at(scale, inverse, np.abs(values))
    assert np.all(np.abs(got["values"] - by_rows) <= 1e-12 * scale)
    exact = tile_sums(inverse, values, len(u), TILE)
    assert got["values"].tobytes() == exact.tobytes()  # the documented order, bit for bit


def on_resident_data(run_dir):
    """The run's log says the step ran on resident data, and it ran no pass before its output pass."""
    log = (run_dir / "logs" / "rank-0.log").read_text()
    return "on resident data" in log and "pass 1 (" not in log


def records_in_host_memory(run_dir):
    return "records in host memory" in (run_dir / "logs" / "rank-0.log").read_text()


def divided_between(run_dir):
    """The ranks the unit on resident data was divided between, as the log says (None: not divided)."""
    m = re.search(r"on resident data divided between (\d+) ranks", (run_dir / "logs" / "rank-0.log").read_text())
    return int(m.group(1)) if m else None


def out_of_core(keys, values, more=""):
    """Options with both budgets an eighth of the data: neither the device nor the host holds the
    records, so the sample, partition and merge passes run, through files."""
    eighth = (keys.nbytes + values.nbytes) // 8 // 1024
    return f"{{device_memory: {eighth}KiB, host_memory: {eighth}KiB{more}}}"


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A 1-rank in-core run per key width: (inputs, outputs). It fits, so it runs on resident
    data: its input read once, no pass before the output pass and no intermediate file."""
    done = {}
    for words in (1, 2):
        tmp = tmp_path_factory.mktemp(f"clean{words}")
        keys, values = make_input(tmp, words)
        _, run_dir = committed_run(tmp, spec_text())
        assert on_resident_data(run_dir)
        got, tile = outputs(run_dir)
        assert tile == TILE
        done[words] = (keys, values, got)
    return done


@pytest.mark.parametrize("words", [1, 2])
def test_equals_numpy_unique(clean, words):
    keys, values, got = clean[words]
    check_against_numpy(got, keys, values)
    assert got["counts"].max() > N // 3  # (the test has its one key that is half the data)


def same(a, b):
    for k in ("keys", "counts", "values", "index"):
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.parametrize("words", [1, 2])
def test_small_budget_and_three_ranks_store_the_same_bytes(clean, tmp_path, words):
    keys, values, want = clean[words]
    data_bytes = keys.nbytes + values.nbytes
    # a device budget three quarters of the data (room for a block and a bucket beside CUB's
    # scratch on cuda), on 1 and 3 ranks: the records in host memory, merged on the
    # device in buckets; both budgets an eighth (the passes: the buckets then follow the
    # budget, many small merges), on 1 and 3 ranks; 7 forced buckets, not a multiple of the ranks,
    # within 4x the data (the passes, as buckets are given); and 3 ranks in core, each on resident data
    device_small = f"{{device_memory: {data_bytes * 3 // 4 // 1024}KiB, max_batch_rows: 2048}}"
    small = out_of_core(keys, values, ", max_batch_rows: 2048")
    sized = f"{{device_memory: {4 * data_bytes // 1024}KiB, max_batch_rows: 2048}}"
    for mpi, options, params in ((0, device_small, ""), (3, device_small, ""), (0, small, ""), (3, small, ""),
                                 (3, sized, ", buckets: 7"), (3, "{}", "")):
        tmp = tmp_path / f"r{mpi}{len(params)}{len(options)}"
        make_input(tmp, words)
        spec = write_spec(tmp / "spec.yaml", spec_text(params, options))
        r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE], mpi=mpi)
        assert r.code == 0, r
        assert on_resident_data(tmp / "run") == (options in ("{}", device_small))  # (else the passes)
        assert records_in_host_memory(tmp / "run") == (options == device_small)
        # (in core on 3 ranks the unit is divided between them; in host memory each runs it whole)
        assert divided_between(tmp / "run") == (3 if mpi == 3 and options == "{}" else None)
        got, _ = outputs(tmp / "run")
        same(got, want)
        if options == small:  # a pass's log line says what it streamed, not the run's state
            line = next(l for l in r.err.splitlines() if "pass 1 (sample) done" in l)
            assert " rows, " in line and "to the device" in line and len(line) < 300, line


def test_forced_buckets_too_large_for_the_budget_are_refused(tmp_path):
    """7 buckets of ~N/20 records each cannot be merged in an eighth of the data: the merge pass's
    planning says so (exit 2, the budget and what one batch needs) instead of overrunning it."""
    keys, values = make_input(tmp_path, 2)
    small = f"{{device_memory: {(keys.nbytes + values.nbytes) // 8 // 1024}KiB, max_batch_rows: 2048}}"
    spec = write_spec(tmp_path / "spec.yaml", spec_text(", buckets: 7", small))
    r = run(["run", spec, "--run-dir", tmp_path / "run", "--device", DEVICE])
    assert r.code == 2, r
    assert re.search(r"pass 3 \(merge\): device memory budget [0-9.]+ [KM]iB is too small: one batch of", r.err), r.err
    assert "internal error" not in r.err, r.err


def test_without_index_or_values(tmp_path):
    keys, values = make_input(tmp_path, 2)
    _, run_dir = committed_run(tmp_path, spec_text(", index: false", values=False))
    with h5py.File(run_dir / "outputs" / "unique.h5", "r") as f:
        assert set(f.keys()) == {"keys", "counts"}
        u, counts = np.unique(as_rows(keys), return_counts=True)
        np.testing.assert_array_equal(as_rows(f["keys"][...]), u)
        np.testing.assert_array_equal(f["counts"][...], counts)


@pytest.mark.parametrize("index, values", [(True, False), (False, True), (False, False)])
def test_divided_between_two_ranks_without_index_or_values(tmp_path, index, values):
    """The unit divided between 2 ranks, without the index, the values or both: one rank's bytes."""
    make_input(tmp_path, 2)
    params = "" if index else ", index: false"
    got = []
    for mpi in (0, 2):
        spec = write_spec(tmp_path / f"spec{mpi}.yaml", spec_text(params, values=values))
        r = run(["run", spec, "--run-dir", tmp_path / f"run{mpi}", "--device", DEVICE], mpi=mpi)
        assert r.code == 0, r
        assert divided_between(tmp_path / f"run{mpi}") == (2 if mpi else None)
        with h5py.File(tmp_path / f"run{mpi}" / "outputs" / "unique.h5", "r") as f:
            assert set(f.keys()) == {"keys", "counts"} | ({"values"} if values else set()) | ({"index"} if index else set())
            got.append({k: f[k][...] for k in f.keys()})
    for k in got[0]:
        assert got[0][k].dtype == got[1][k].dtype and got[0][k].tobytes() == got[1][k].tobytes(), k


@pytest.mark.parametrize("resume_ranks", [0, 3])
def test_stopped_and_resumed_on_any_rank_count(clean, tmp_path, resume_ranks):
    """SIGTERM in the partition pass (its first checkpoint), then resumed, here or on 3 ranks:
    the same bytes as the clean run."""
    keys, values, want = clean[2]
    make_input(tmp_path, 2)
    spec = write_spec(tmp_path / "spec.yaml",
                      spec_text(options=out_of_core(keys, values, ", max_batch_rows: 1024, checkpoint_interval: 0")))
    run_dir = tmp_path / "run"
    stop_once_checkpointed(spec, run_dir, run_dir / "steps" / "unique" / "pass-1" / "journal.json")
    assert manifest(run_dir)["steps"]["unique"]["state"] == "stopped"
    r = run(["resume", run_dir, "--device", DEVICE], mpi=resume_ranks)
    assert r.code == 0, r
    assert "resumed from the state an earlier run committed" in r.err, r
    got, _ = outputs(run_dir)
    same(got, want)


@pytest.mark.parametrize("device_half, ranks", [(False, 0), (True, 0), (False, 3)])
def test_on_resident_data_stopped_in_the_output_pass_resumes_to_the_same_bytes(clean, tmp_path, device_half, ranks):
    """Nothing of the unit on resident data is committed (in device memory, or in host memory with a
    device budget half the data, or divided between 3 ranks): a resume runs it again, then continues
    the output pass from its last commit, with the clean run's bytes."""
    keys, values, want = clean[2]
    make_input(tmp_path, 2)
    device = f"device_memory: {(keys.nbytes + values.nbytes) // 2 // 1024}KiB, " if device_half else ""
    spec = write_spec(tmp_path / "spec.yaml", spec_text(options=f"{{{device}max_batch_rows: 1024, checkpoint_interval: 0}}"))
    if ranks:  # (SIGTERM to every rank at the output pass's first commit, as srun sends it)
        run_dir = tmp_path / "run"
        code, err = sigterm_mpi_run(ranks, ["run", spec, "--run-dir", run_dir, "--device", DEVICE],
                                    run_dir / "steps" / "unique" / "journal.json")
        if code == 0:
            pytest.skip("the run finished before SIGTERM arrived")
        assert code == 75, err
        r = run(["resume", run_dir, "--device", DEVICE], mpi=ranks)
        assert r.code == 0 and "resuming at row" in r.err, r
    else:
        r = stop_then_resume(spec, tmp_path / "run", "unique")
    assert divided_between(tmp_path / "run") == (ranks or None)
    assert "on resident data" in r.err, r
    assert ("records in host memory" in r.err) == device_half, r
    same(outputs(tmp_path / "run")[0], want)


def stopped_in_the_merge(tmp_path):
    """keys.dedup stopped at the merge pass's first checkpoint (or just after the merge)."""
    keys, values = make_input(tmp_path, 2)
    spec = write_spec(tmp_path / "spec.yaml",
                      spec_text(options=out_of_core(keys, values, ", max_batch_rows: 1024, checkpoint_interval: 0")))
    run_dir = tmp_path / "run"
    stop_once_checkpointed(spec, run_dir, run_dir / "steps" / "unique" / "pass-2" / "journal.json")
    return run_dir, run_dir / "steps" / "unique"


def test_passes_no_longer_read_are_deleted_at_once(clean, tmp_path):
    """Stopped in (or just after) the merge: the sample pass's folder is gone (its result is in
    the run's state), the merge's is there; the resumed run gives the clean run's bytes."""
    run_dir, step = stopped_in_the_merge(tmp_path)
    assert not (step / "pass-0").exists()
    assert (step / "pass-2").exists()
    r = run(["resume", run_dir, "--device", DEVICE])
    assert r.code == 0, r
    assert "resumed from the state an earlier run committed" in r.err, r
    same(outputs(run_dir)[0], clean[2][2])


def test_a_state_whose_pass_outputs_are_gone_starts_the_step_again(clean, tmp_path):
    """The pass folders a committed state reads, deleted while the run was stopped (as an
    operating-system crash between a pass and the next commit point could leave them): one
    warning, the step's run starts again, the same bytes."""
    run_dir, step = stopped_in_the_merge(tmp_path)
    for d in step.glob("pass-*"):
        shutil.rmtree(d)
    r = run(["resume", run_dir, "--device", DEVICE])
    assert r.code == 0, r
    assert "which it reads, is gone" in r.err and "the step starts again" in r.err, r.err
    same(outputs(run_dir)[0], clean[2][2])


@pytest.mark.parametrize("make, message", [
    (lambda f: (f.create_dataset("keys", data=np.zeros(10, np.int64)), f.create_dataset("values", data=np.zeros(10))),
     "input 'keys' has dtype int64; expected uint64"),
    (lambda f: (f.create_dataset("keys", data=np.zeros((10, 5), np.uint64)), f.create_dataset("values", data=np.zeros(10))),
     "input 'keys' has shape [10, 5]; expected (n,) or (n, w) with 1 to 4 words per key"),
    (lambda f: (f.create_dataset("keys", data=np.zeros(10, np.uint64)), f.create_dataset("values", data=np.zeros(9))),
     "input 'values' has shape [9]; expected (10,), one value per row of input 'keys'"),
    (lambda f: (f.create_dataset("keys", data=np.zeros(10, np.uint64)), f.create_dataset("values", data=np.zeros(10, np.float32))),
     "input 'values' has dtype float32; expected float64"),
])
def test_bad_inputs_exit_2_with_one_line(tmp_path, make, message):
    with h5py.File(tmp_path / "in.h5", "w") as f:
        make(f)
    spec = write_spec(tmp_path / "spec.yaml", spec_text())
    r = run(["run", spec, "--run-dir", tmp_path / "run", "--device", DEVICE])
    one_line_error(r, message)
