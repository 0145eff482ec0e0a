"""Any step's streamed outputs written compressed (a step's `compress_output`): the engine codes each
chunk right after the stage's kernel. h5py reads the values through the plugin, within the bound of
the same step run uncompressed (numpy checks it); later steps read them directly; an interrupted
and resumed run and a run on 3 ranks store the same bytes as one uninterrupted run; bad settings
are refused before anything runs."""
import random
import re

import numpy as np
import pytest

from h5plugin import PLUGIN_DIR  # noqa: F401  (before h5py: it sets HDF5_PLUGIN_PATH)
from conftest import DEVICE, kill_and_resume, manifest, run, run_seconds, stop_then_resume, write_spec

import h5py  # noqa: E402


def run_ok(tmp, text, name="run", extra=(), mpi=0):
    spec = write_spec(tmp / "spec.yaml", text)
    r = run(["run", spec, "--run-dir", tmp / name, "--device", DEVICE, *extra], cwd=tmp, mpi=mpi)
    assert r.code == 0, r
    return tmp / name


def read(run_dir, step, dataset="data"):
    with h5py.File(run_dir / "outputs" / f"{step}.h5", "r") as f:
        return f[dataset][()], dict(f[dataset].attrs)


def parts(a):
    a = np.asarray(a)
    return [a.real.astype(np.float64), a.imag.astype(np.float64)] if np.iscomplexobj(a) else [a.astype(np.float64)]


def max_part_error(a, b):
    return max(np.max(np.abs(x - y)) for x, y in zip(parts(a), parts(b)))


def random_step(step_id, shape, dtype, chunk_rows, compress=None, seed=3):
    text = f"""  - id: {step_id}
    stage: tensor.random
    params: {{shape: {list(shape)}, dtype: {dtype}, seed: {seed}, chunk_rows: {chunk_rows}}}
"""
    if compress:
        text += f"    compress_output: {compress}\n"
    return text


SPEC_HEAD = "name: packed\noptions: {device_memory: 64MiB, max_batch_rows: 300}\nsteps:\n"


@pytest.mark.parametrize("pipeline", ["quantized", "integrated", "szx"])
def test_absolute_bound_holds_and_h5py_decompress_and_later_steps_agree(tmp, pipeline):
    shape = (1001, 40)  # the last chunk is short: zero-padded in the stream, clipped by HDF5
    text = SPEC_HEAD + random_step("raw", shape, "complex64", 128) + random_step(
        "packed", shape, "complex64", 128, f"{{pipeline: {pipeline}, error: 2.0e-2, threshold: 1.0e-2}}") + """  - id: back
    stage: decompress
    inputs: {x: packed}
  - id: stats
    stage: tensor.stats
    inputs: {x: packed}
"""
    run_dir = run_ok(tmp, text)
    raw, _ = read(run_dir, "raw")
    packed, attrs = read(run_dir, "packed")
    back, _ = read(run_dir, "back")
    assert packed.shape == raw.shape and packed.dtype == np.complex64
    assert max_part_error(packed, raw) <= 2.0e-2
    assert max_part_error(packed, raw) > 0  # it is lossy: the bound is used, not ignored
    np.testing.assert_array_equal(back, packed)  # qstage's decoder gives what h5py's plugin gives
    with h5py.File(run_dir / "outputs" / "stats.h5", "r") as f:
        assert f["norm"][()] == pytest.approx(np.linalg.norm(packed.astype(np.complex128)), rel=1e-12)
    assert attrs["codec.pipeline"] == pipeline and attrs["codec.bounds"] == "absolute"
    assert attrs["codec.error"] == 2.0e-2 and attrs["codec.filter_id"] == 32881
    assert "qsum64" not in attrs
    m = manifest(run_dir)
    assert m["steps"]["packed"]["checksums"]["data"] == attrs["stored_xxh64"]
    with h5py.File(run_dir / "outputs" / "packed.h5", "r") as f:
        stored = sum(f["data"].id.get_chunk_info(i).size for i in range(f["data"].id.get_num_chunks()))
    assert stored == attrs["codec.stored_bytes"]
    if pipeline == "quantized":  # the others truncate bits: uniform noise compresses about 2x at this bound
        assert stored < raw.nbytes / 2


def test_chunk_bounds_are_fractions_of_each_chunks_range(tmp):
    shape, rows = (900, 33), 100
    text = SPEC_HEAD + random_step("raw", shape, "float32", rows, seed=9) + random_step(
        "packed", shape, "float32", rows, "{pipeline: integrated, error: 1.0e-3, bounds: chunk}", seed=9)
    run_dir = run_ok(tmp, text)
    raw, _ = read(run_dir, "raw")
    packed, attrs = read(run_dir, "packed")
    assert attrs["codec.bounds"] == "chunk" and attrs["codec.error_given"] == 1.0e-3
    for first in range(0, shape[0], rows):
        a, b = raw[first:first + rows], packed[first:first + rows]
        bound = 1.0e-3 * (float(a.max()) - float(a.min()))
        assert np.max(np.abs(a.astype(np.float64) - b)) <= bound, first


def test_only_the_named_outputs_and_a_statevector_declared_at_run_time(tmp):
    circuit = ("precision: complex64\n      random: {rows: 3, cols: 3, cycles: 8, seed: 1}\n      "
               "random_bitstrings: {count: 700, seed: 2}")
    text = SPEC_HEAD + f"""  - id: exact
    stage: tn.statevector
    params:
      {circuit}
  - id: packed
    stage: tn.statevector
    params:
      {circuit}
    compress_output: {{pipeline: quantized, error: 1.0e-4, datasets: [amplitudes]}}
"""
    run_dir = run_ok(tmp, text)
    exact, _ = read(run_dir, "exact", "amplitudes")
    packed, attrs = read(run_dir, "packed", "amplitudes")
    assert attrs["codec.pipeline"] == "quantized"
    assert max_part_error(packed, exact) <= 1.0e-4
    with h5py.File(run_dir / "outputs" / "packed.h5", "r") as f:
        assert "bitstrings" in f  # the stage's other results are there as before


# About 100 checkpoints; long enough (1-2 s) for kills to land inside the step on a GPU machine too.
BIG = random_step("packed", (200000, 32), "complex64", 1000, "{pipeline: quantized, error: 1.0e-2}", seed=4)
BIG_SPEC = ("name: packedbig\noptions: {device_memory: 64MiB, max_batch_rows: 2000, checkpoint_interval: 0}\n"
            "steps:\n" + BIG)


def stored(run_dir):
    _, attrs = read(run_dir, "packed")
    return attrs["stored_xxh64"], manifest(run_dir)["steps"]["packed"]["checksums"]["data"]


@pytest.fixture(scope="module")
def clean_big_run(tmp_path_factory):
    return run_ok(tmp_path_factory.mktemp("clean"), BIG_SPEC)


@pytest.fixture(scope="module")
def clean_big(clean_big_run):
    return stored(clean_big_run)


def test_stopped_and_resumed_run_stores_the_same_bytes(clean_big, tmp):
    spec = write_spec(tmp / "spec.yaml", BIG_SPEC)
    stop_then_resume(spec, tmp / "run", "packed")
    assert stored(tmp / "run") == clean_big


def test_random_sigkills_then_resume_store_the_same_bytes(clean_big, clean_big_run, tmp):
    """SIGKILL at random instants (mid-batch, mid-commit, mid-write of the chunks): the spool is cut
    back to its last commit on resume, so the stored bytes equal an uninterrupted run's."""
    spec = write_spec(tmp / "spec.yaml", BIG_SPEC)
    rng = random.Random(20261122)
    seconds = run_seconds(clean_big_run)
    kills, resumed, runs, target = 0, 0, 0, 8
    while kills < target:
        run_dir = tmp / f"run{runs}"
        runs += 1
        kills += kill_and_resume(["run", spec, "--run-dir", run_dir, "--device", DEVICE], run_dir, target - kills,
                                 lambda: rng.uniform(0.05, 1.0) * seconds / 4)
        resumed += len(re.findall(r"resuming at row [1-9]", (run_dir / "logs" / "rank-0.log").read_text()))
        assert stored(run_dir) == clean_big, f"after {kills} kills"
        if resumed == 0 and target < 40:
            target += 4  # no kill landed inside the step yet: more of them
    assert resumed > 0, "no run ever resumed from a checkpoint"


def test_three_ranks_store_the_same_bytes_as_one(clean_big, tmp):
    assert stored(run_ok(tmp, BIG_SPEC, "run3", mpi=3)) == clean_big


def test_changing_the_settings_reruns_the_step_and_says_why(tmp):
    text = SPEC_HEAD + random_step("packed", (300, 8), "float32", 100, "{error: 1.0e-2}")
    run_ok(tmp, text)
    r = run(["run", write_spec(tmp / "spec.yaml", text.replace("1.0e-2", "1.0e-3")), "--run-dir", tmp / "run",
             "--device", DEVICE], cwd=tmp)
    assert r.code == 0, r
    assert "compress_output changed" in r.err, r
    _, attrs = read(tmp / "run", "packed")
    assert attrs["codec.error"] == 1.0e-3
    r = run(["run", tmp / "spec.yaml", "--run-dir", tmp / "run", "--device", DEVICE], cwd=tmp)
    assert r.code == 0 and "up to date" in r.err, r


@pytest.mark.parametrize("step, compress, message", [
    (random_step("s", (10, 4), "float64", 5), "{error: 1.0e-3}",
     "compress_output: output 'data' has dtype float64; expected float32 or complex64"),
    (random_step("s", (10, 4), "float32", 5), "{error: 1.0e-3, datasets: [nope]}",
     "compress_output: datasets names 'nope', which is not a streamed output of stage tensor.random; expected one of data"),
    (random_step("s", (10, 4), "float32", 5), "{error: 1.0e-3, pipeline: zip}", "compress_output"),
    (random_step("s", (10, 4), "float32", 5), "{pipeline: szx}", "error"),
    (random_step("s", (10, 4), "float32", 5) + """  - id: t
    stage: tensor.stats
    inputs: {x: s}
""", "{error: 1.0e-3}", "compress_output: stage tensor.stats writes no streamed dataset to compress"),
])
def test_bad_settings_are_refused_before_anything_runs(tmp, step, compress, message):
    text = SPEC_HEAD + step + f"    compress_output: {compress}\n"
    r = run(["run", write_spec(tmp / "spec.yaml", text), "--run-dir", tmp / "run", "--device", DEVICE], cwd=tmp)
    assert r.code == 2, r
    assert message in r.err, r
    assert not (tmp / "run" / "outputs" / "s.h5").exists()


def test_gpu_and_cpu_store_the_same_chunks(tmp):
    """Stated tolerance: none. The GPU coder makes the CPU coder's bytes (kernels/codec/codec_encode.cu)."""
    text = SPEC_HEAD + random_step("a", (2001, 64), "complex64", 256, "{pipeline: quantized, error: 1.0e-2}") + \
        random_step("b", (2001, 64), "float32", 256, "{pipeline: integrated, error: 1.0e-3, bounds: chunk}")
    spec = write_spec(tmp / "spec.yaml", text)
    gpu = run(["run", spec, "--run-dir", tmp / "gpu", "--device", "cuda"], cwd=tmp)
    if gpu.code == 2 and "--device cuda" in gpu.err:
        pytest.skip("GPU comparison skipped: " + gpu.err.strip().splitlines()[-1])
    assert gpu.code == 0, gpu
    cpu = run(["run", spec, "--run-dir", tmp / "cpu", "--device", "cpu"], cwd=tmp)
    assert cpu.code == 0, cpu
    for step in ["a", "b"]:
        assert read(tmp / "gpu", step)[1]["stored_xxh64"] == read(tmp / "cpu", step)[1]["stored_xxh64"], step
