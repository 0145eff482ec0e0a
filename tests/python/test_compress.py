"""The compression stages (stages/compress): `compress` writes chunks that h5py reads through the
filter plugin with the values `decompress` decodes, every part within the bound of the original
(numpy checks it); relative bounds refer to the whole dataset's range; `compress.evaluate`
reports what numpy measures on the same data; interrupted, resumed and multi-rank runs store the
same bytes as one uninterrupted run."""
import json

import numpy as np
import pytest

from h5plugin import PLUGIN_DIR  # noqa: F401  (before h5py: it sets HDF5_PLUGIN_PATH)
from oracle import spiky
from conftest import DEVICE, ROOT, manifest, run, stop_then_resume, write_spec

import h5py  # noqa: E402

PIPELINES = ["szx", "threshold", "group", "group2l", "integrated", "quantized"]


def circuit_like(rng, shape, dtype):
    """Spiky values with many near zero and a few NaN/Inf-free extremes, like circuit tensors."""
    n = int(np.prod(shape))
    if dtype == np.complex64:
        x = spiky(rng, n) + 1j * spiky(rng, n)
    else:
        x = spiky(rng, n)
    return x.astype(dtype).reshape(shape)


def write_input(path, data, chunks=None):
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=chunks)


def spec_for(steps):
    return "name: codec\noptions: {device_memory: 256MiB, max_batch_rows: 300}\nsteps:\n" + steps


def compress_steps(params, src="{file: in.h5, dataset: x}"):
    return f"""  - id: packed
    stage: compress
    inputs: {{x: {src}}}
    params: {params}
  - id: unpacked
    stage: decompress
    inputs: {{x: packed}}
"""


def outputs(run_dir, step):
    return h5py.File(run_dir / "outputs" / f"{step}.h5", "r")


def parts(a):
    """Real and imaginary parts as float64 arrays (one array for real data)."""
    a = np.asarray(a)
    return [a.real.astype(np.float64), a.imag.astype(np.float64)] if np.iscomplexobj(a) else [a.astype(np.float64)]


def max_part_error(a, b):
    return max(np.max(np.abs(x - y)) for x, y in zip(parts(a), parts(b)))


def value_range(x):
    p = np.concatenate([q.ravel() for q in parts(x)])
    p = p[np.isfinite(p)]
    return p.max() - p.min()


def run_ok(tmp, text, name="run", extra=()):
    spec = write_spec(tmp / "spec.yaml", text)
    r = run(["run", spec, "--run-dir", tmp / name, "--device", DEVICE, *extra], cwd=tmp)
    assert r.code == 0, r
    return tmp / name


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_roundtrip_within_the_bound_and_h5py_reads_what_decompress_decodes(tmp, pipeline, dtype):
    x = circuit_like(np.random.default_rng(3), (1234, 40), dtype)  # 1234 rows: a short last chunk
    write_input(tmp / "in.h5", x)
    run_dir = run_ok(tmp, spec_for(compress_steps(f"{{pipeline: {pipeline}, error: 1.0e-3, threshold: 2.0e-3, "
                                                  f"chunk_rows: 100}}")))
    r = value_range(x)
    bound = max(1e-3, 2e-3 if pipeline != "szx" else 0) * r
    with outputs(run_dir, "packed") as f, outputs(run_dir, "unpacked") as g:
        d = f["data"]
        assert d.dtype == dtype and d.shape == x.shape and d.chunks == (100, 40)
        assert list(d._filters) == ["32881"]
        assert d.attrs["codec.pipeline"] == pipeline
        assert d.attrs["codec.range"] == pytest.approx(r, rel=1e-12)
        assert d.attrs["codec.error"] == pytest.approx(1e-3 * r, rel=1e-12)
        via_plugin = d[...]
        decoded = g["data"][...]
        assert decoded.dtype == dtype and decoded.shape == x.shape
        # The plugin (CPU, inside h5py's HDF5) and the stage's decoder give the same bits.
        np.testing.assert_array_equal(via_plugin.view(np.uint32), decoded.view(np.uint32))
        assert max_part_error(decoded, x) <= bound
        stored = int(d.attrs["codec.stored_bytes"])
        assert stored == sum(d.id.get_chunk_info(i).size for i in range(d.id.get_num_chunks()))
        assert d.id.get_num_chunks() == 13
        assert f.attrs["compress.ratio"] == pytest.approx(x.nbytes / stored)
        m = manifest(run_dir)["steps"]["packed"]
        assert m["checksums"]["data"] == d.attrs["stored_xxh64"]
        assert "ratio" in m["results"]


def test_relative_bounds_use_the_whole_dataset_range_and_absolute_bounds_are_values(tmp):
    rng = np.random.default_rng(5)
    x = circuit_like(rng, (2000, 16), np.complex64)
    x[1500:] *= 1e-3  # the later chunks span a far smaller range than the dataset
    write_input(tmp / "in.h5", x)
    steps = compress_steps("{pipeline: integrated, error: 1.0e-3, threshold: 1.0e-3}")
    steps += """  - id: fixed
    stage: compress
    inputs: {x: {file: in.h5, dataset: x}}
    params: {pipeline: integrated, error: 0.01, threshold: 0.02, bounds: absolute}
  - id: given
    stage: compress
    inputs: {x: {file: in.h5, dataset: x}}
    params: {pipeline: integrated, error: 1.0e-3, threshold: 1.0e-3, range: 100.0}
"""
    run_dir = run_ok(tmp, spec_for(steps))
    r = value_range(x)
    with outputs(run_dir, "packed") as f:
        assert f["data"].attrs["codec.error"] == pytest.approx(1e-3 * r, rel=1e-12)
        assert max_part_error(f["data"][...], x) <= 1e-3 * r
        # The later rows lost everything below 1e-3 of the whole range: the bound is the dataset's.
        assert np.count_nonzero(f["data"][1500:]) < np.count_nonzero(x[1500:])
    with outputs(run_dir, "fixed") as f:
        assert f["data"].attrs["codec.bounds"] == "absolute"
        assert f["data"].attrs["codec.error"] == 0.01 and f["data"].attrs["codec.threshold"] == 0.02
        assert max_part_error(f["data"][...], x) <= 0.02
    with outputs(run_dir, "given") as f:
        assert f["data"].attrs["codec.range"] == 100.0
        assert f["data"].attrs["codec.error"] == pytest.approx(0.1)
        assert max_part_error(f["data"][...], x) <= 0.1


def test_nan_and_inf_come_back_bit_for_bit(tmp):
    x = circuit_like(np.random.default_rng(7), (700, 8), np.float32)
    x[3, 2], x[400, 0], x[699, 7] = np.nan, np.inf, -np.inf
    write_input(tmp / "in.h5", x)
    run_dir = run_ok(tmp, spec_for(compress_steps("{pipeline: quantized, chunk_rows: 64}")))
    with outputs(run_dir, "unpacked") as g:
        y = g["data"][...]
    special = ~np.isfinite(x)
    np.testing.assert_array_equal(y[special].view(np.uint32), x[special].view(np.uint32))
    finite = x[np.isfinite(x)]
    assert np.max(np.abs(y[~special].astype(np.float64) - x[~special])) <= 1e-3 * (finite.max() - finite.min())


def bit_sensitive(rng, rows, cols):
    """float32 rows x cols holding what only a bitwise comparison tells apart: -0 (rows of it, beside
    +0, among other values), NaN with payloads and of both signs, infinities and denormals."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[: rows // 4] = -0.0
    x[rows // 4: rows // 2: 2] = 0.0
    x[rows // 4 + 1: rows // 2: 2] = np.where(np.arange(cols) % 3 == 0, np.float32(-0.0), np.float32(0.0))
    x[rows // 2:][rng.random((rows - rows // 2, cols)) < 0.1] = -0.0
    special = np.array([0x7fc00000, 0x7fc00001, 0xffc12345, 0x7f800001, 0x7f800000, 0xff800000, 0x00000001,
                        0x80000001, 0x807fffff, 0x7f7fffff, 0x80000000], np.uint32).view(np.float32)
    x.reshape(-1)[-len(special):] = special
    return x


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_lossless_coding_keeps_every_bit(tmp, pipeline, dtype):
    """docs/compression.md: e = 0 (t = 0) keeps every bit, -0 and NaN payloads included."""
    x = bit_sensitive(np.random.default_rng(31), 700, 16)
    if dtype == np.complex64:
        x = x.view(np.complex64)  # (pairs of the same values: -0 in both parts, in one, in none)
    write_input(tmp / "in.h5", x)
    run_dir = run_ok(tmp, spec_for(compress_steps(f"{{pipeline: {pipeline}, error: 0, threshold: 0, chunk_rows: 128}}")))
    with outputs(run_dir, "packed") as f, outputs(run_dir, "unpacked") as g:
        np.testing.assert_array_equal(g["data"][...].view(np.uint32), x.view(np.uint32))
        np.testing.assert_array_equal(f["data"][...].view(np.uint32), x.view(np.uint32))  # (the filter plugin)


def test_evaluate_reports_what_numpy_measures(tmp):
    x = circuit_like(np.random.default_rng(9), (1500, 32), np.complex64)
    write_input(tmp / "in.h5", x)
    params = "{pipeline: group, error: 5.0e-3, threshold: 5.0e-3, chunk_rows: 128}"
    steps = compress_steps(params) + f"""  - id: eval
    stage: compress.evaluate
    inputs: {{x: {{file: in.h5, dataset: x}}}}
    params: {params}
"""
    run_dir = run_ok(tmp, spec_for(steps))
    with outputs(run_dir, "unpacked") as g, outputs(run_dir, "packed") as f, outputs(run_dir, "eval") as e:
        y = g["data"][...].astype(np.complex128)
        a = x.astype(np.complex128)
        assert e["ratio"][()] == pytest.approx(x.nbytes / f["data"].attrs["codec.stored_bytes"], rel=1e-12)
        assert e["stored_bytes"][()] == f["data"].attrs["codec.stored_bytes"]
        assert e["max_error"][()] == pytest.approx(max_part_error(y, a), rel=1e-12)
        assert e["bound"][()] == pytest.approx(5e-3 * value_range(x), rel=1e-12)
        assert e["beyond_bound"][()] == 0
        fidelity = abs(np.vdot(a, y)) / (np.linalg.norm(a) * np.linalg.norm(y))
        assert e["fidelity"][()] == pytest.approx(fidelity, abs=1e-12)
        assert e["relative_error"][()] == pytest.approx(np.linalg.norm(a - y) / np.linalg.norm(a), rel=1e-9)
        assert e["compress_gbps"][()] > 0 and e["decompress_gbps"][()] > 0


def test_h5py_written_dataset_decompresses_to_what_h5py_reads(tmp):
    x = circuit_like(np.random.default_rng(11), (900, 10), np.float32)
    # h5py's own write through the plugin: bounds relative to each chunk's range (cd_values flag 1).
    import struct
    t_lo, t_hi = struct.unpack("<II", struct.pack("<d", 1e-3))
    with h5py.File(tmp / "in.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(128, 10), compression=32881,
                         compression_opts=(1, 0, 5, 128, 1, t_lo, t_hi, t_lo, t_hi))
    with h5py.File(tmp / "in.h5", "r") as f:
        want = f["x"][...]
    run_dir = run_ok(tmp, spec_for("""  - id: unpacked
    stage: decompress
    inputs: {x: {file: in.h5, dataset: x}}
"""))
    with outputs(run_dir, "unpacked") as g:
        np.testing.assert_array_equal(g["data"][...].view(np.uint32), want.view(np.uint32))


def test_other_stages_read_compressed_outputs(tmp):
    """qstage registers the filter itself: tensor.stats reads a compressed dataset directly."""
    x = circuit_like(np.random.default_rng(13), (600, 12), np.complex64)
    write_input(tmp / "in.h5", x)
    steps = compress_steps("{pipeline: quantized}") + """  - id: stats
    stage: tensor.stats
    inputs: {x: packed}
"""
    r = run(["run", write_spec(tmp / "spec.yaml", spec_for(steps)), "--run-dir", tmp / "run", "--device", DEVICE],
            cwd=tmp, env={"HDF5_PLUGIN_PATH": "/nonexistent"})
    assert r.code == 0, r
    with outputs(tmp / "run", "unpacked") as g, outputs(tmp / "run", "stats") as s:
        assert s["norm"][()] == pytest.approx(np.linalg.norm(g["data"][...].astype(np.complex128)), rel=1e-12)


BIG = """  - id: x
    stage: tensor.random
    params: {shape: [60000, 32], dtype: complex64, seed: 4, chunk_rows: 250}
  - id: packed
    stage: compress
    inputs: {x: x}
    params: {pipeline: quantized, error: 1.0e-2, threshold: 1.0e-2}
  - id: unpacked
    stage: decompress
    inputs: {x: packed}
"""
BIG_SPEC = ("name: codecbig\noptions: {device_memory: 64MiB, max_batch_rows: 500, checkpoint_interval: 0}\n"
            "steps:\n" + BIG)


def stored(run_dir):
    with outputs(run_dir, "packed") as f, outputs(run_dir, "unpacked") as g:
        return f["data"].attrs["stored_xxh64"], g["data"].attrs["qsum64"]


@pytest.fixture(scope="module")
def clean_big(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clean")
    return stored(run_ok(tmp, BIG_SPEC))


def test_stopped_and_resumed_compression_stores_the_same_bytes(clean_big, tmp):
    spec = write_spec(tmp / "spec.yaml", BIG_SPEC)
    r = stop_then_resume(spec, tmp / "run", "packed")
    assert stored(tmp / "run") == clean_big
    # The resumed step codes with the range the first run measured, without reading it again.
    assert "measured by an earlier run of this step" in r.err and "measured in" not in r.err, r


def test_a_run_stopped_in_each_of_its_passes_stores_the_same_bytes(clean_big, tmp):
    """compress is a stage of two passes (the value range, then the coding): stopped in the first
    (SIGTERM), then killed in the second (SIGKILL), it resumes each in the pass it stopped in, never
    measures the range twice, and stores what one uninterrupted run stores."""
    import os
    import signal
    import subprocess
    import time
    from conftest import QSTAGE

    spec = write_spec(tmp / "spec.yaml", BIG_SPEC)
    run_dir = tmp / "run"
    work = run_dir / "steps" / "packed"

    def start_until(args, path):
        p = subprocess.Popen([QSTAGE, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="2"))
        end = time.time() + 120
        while time.time() < end and not path.exists() and p.poll() is None:
            time.sleep(0.005)
        return p

    # Stopped in the range pass, once it has committed some rows.
    p = start_until(["run", spec, "--run-dir", run_dir, "--device", DEVICE], work / "pass-0" / "journal.json")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    if p.returncode == 0 or (work / "run-state.bin").exists():
        pytest.skip("the range pass finished before SIGTERM arrived")
    assert p.returncode == 75, err
    assert "pass 1 (range)" in err, err
    assert manifest(run_dir)["steps"]["packed"]["pass"] == "pass 1 (range)"

    # Resumed in the range pass, then killed in the coding pass once it has committed some rows.
    p = start_until(["resume", run_dir, "--device", DEVICE], work / "journal.json")
    p.send_signal(signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    assert "resuming at row" in err, err  # (the range pass went on from its commit)
    if p.returncode == 0:
        pytest.skip("the coding pass finished before SIGKILL arrived")
    assert (work / "run-state.bin").exists(), "the range pass's result was not committed"

    r = run(["resume", run_dir, "--device", DEVICE])
    assert r.code == 0, r
    assert "resumed from the state an earlier run committed (1 of its passes done)" in r.err and "measured by an earlier run" in r.err, r
    assert "measured in the range pass" not in r.err, r
    assert stored(run_dir) == clean_big


def test_three_ranks_store_the_same_bytes_as_one(clean_big, tmp):
    spec = write_spec(tmp / "spec.yaml", BIG_SPEC)
    r = run(["run", spec, "--run-dir", tmp / "run3", "--device", DEVICE], mpi=3)
    assert r.code == 0, r
    assert stored(tmp / "run3") == clean_big
    # The step's totals are the whole output's, though rank 0 alone holds the coded chunks.
    with outputs(tmp / "run3", "packed") as f:
        d = f["data"]
        chunk_bytes = sum(d.id.get_chunk_info(i).size for i in range(d.id.get_num_chunks()))
        assert f.attrs["compress.stored_bytes"] == chunk_bytes > 0
        assert f.attrs["compress.ratio"] == pytest.approx(f.attrs["compress.input_bytes"] / chunk_bytes)


def test_a_corrupted_chunk_fails_with_its_number_and_writes_nothing(tmp):
    x = circuit_like(np.random.default_rng(17), (800, 16), np.complex64)
    write_input(tmp / "in.h5", x)
    run_dir = run_ok(tmp, spec_for(compress_steps("{pipeline: integrated, chunk_rows: 200}")))
    bad = tmp / "bad.h5"
    bad.write_bytes((run_dir / "outputs" / "packed.h5").read_bytes())
    with h5py.File(bad, "r") as f:
        info = f["data"].id.get_chunk_info(2)
    raw = bytearray(bad.read_bytes())
    raw[info.byte_offset + info.size // 2] ^= 0x40
    bad.write_bytes(bytes(raw))
    spec = write_spec(tmp / "bad.yaml", spec_for("""  - id: unpacked
    stage: decompress
    inputs: {x: {file: bad.h5, dataset: data}}
"""))
    r = run(["run", spec, "--run-dir", tmp / "badrun", "--device", DEVICE], cwd=tmp)
    assert r.code == 2, r
    assert "qstage: error: chunk 2 (rows from 400)" in r.err and "checksum mismatch" in r.err, r
    assert not (tmp / "badrun" / "outputs" / "unpacked.h5").exists()


def test_output_layouts_match_their_schemas(tmp):
    jsonschema = pytest.importorskip("jsonschema")
    x = circuit_like(np.random.default_rng(19), (300, 6), np.float32)
    write_input(tmp / "in.h5", x)
    steps = compress_steps("{pipeline: szx}") + """  - id: eval
    stage: compress.evaluate
    inputs: {x: {file: in.h5, dataset: x}}
"""
    run_dir = run_ok(tmp, spec_for(steps))
    for step, stage in [("packed", "compress"), ("unpacked", "decompress"), ("eval", "compress.evaluate")]:
        r = run(["inspect", run_dir / "outputs" / f"{step}.h5", "--json"])
        assert r.code == 0, r
        jsonschema.validate(json.loads(r.out), json.loads((ROOT / "schemas" / "outputs" / f"{stage}.json").read_text()))


def test_gpu_and_cpu_store_the_same_chunks_and_decode_the_same_values(tmp):
    """Stated tolerance: none. The GPU coder makes the CPU coder's bytes (kernels/codec/codec_encode.cu)."""
    x = circuit_like(np.random.default_rng(23), (3001, 64), np.complex64)
    write_input(tmp / "in.h5", x, chunks=(256, 64))
    steps = compress_steps("{pipeline: quantized}")
    for p in ["integrated", "group2l", "szx"]:
        steps += f"""  - id: packed_{p}
    stage: compress
    inputs: {{x: {{file: in.h5, dataset: x}}}}
    params: {{pipeline: {p}, error: 1.0e-2, threshold: 1.0e-2}}
  - id: unpacked_{p}
    stage: decompress
    inputs: {{x: packed_{p}}}
"""
    steps += """  - id: eval
    stage: compress.evaluate
    inputs: {x: {file: in.h5, dataset: x}}
"""
    spec = write_spec(tmp / "spec.yaml", spec_for(steps))
    gpu = run(["run", spec, "--run-dir", tmp / "gpu", "--device", "cuda"], cwd=tmp)
    if gpu.code == 2 and "--device cuda" in gpu.err:
        pytest.skip("GPU comparison skipped: " + gpu.err.strip().splitlines()[-1])
    assert gpu.code == 0, gpu
    cpu = run(["run", spec, "--run-dir", tmp / "cpu", "--device", "cpu"], cwd=tmp)
    assert cpu.code == 0, cpu
    for suffix in ["", "_integrated", "_group2l", "_szx"]:
        with outputs(tmp / "gpu", "packed" + suffix) as g, outputs(tmp / "cpu", "packed" + suffix) as c:
            assert g["data"].attrs["stored_xxh64"] == c["data"].attrs["stored_xxh64"], suffix
        with outputs(tmp / "gpu", "unpacked" + suffix) as g, outputs(tmp / "cpu", "unpacked" + suffix) as c:
            np.testing.assert_array_equal(g["data"][...].view(np.uint32), c["data"][...].view(np.uint32))
    with outputs(tmp / "gpu", "eval") as g, outputs(tmp / "cpu", "eval") as c:
        for name in ["ratio", "max_error", "bound", "beyond_bound", "relative_error", "fidelity", "stored_bytes"]:
            assert g[name][()] == c[name][()], name


def test_evaluate_measures_the_qaoa_energy_change_of_a_state_vector(tmp):
    """compress.evaluate's maxcut energy: the original's equals the sum over the graph's edges of
    tn.statevector's <Z_a Z_b> (an independent code path) and numpy's on the amplitudes; the
    decoded one equals numpy's on the values h5py reads from a compress step with the same settings."""
    nodes, seed = 10, 5
    qaoa = f"precision: complex64, qaoa: {{nodes: {nodes}, p: 2, seed: {seed}}}"
    # Rows: the 16 values of qubits 0-3 (qubit 0 most significant); columns: qubits 4-9 open.
    bitstrings = [format(b, "04b") + "0" * 6 for b in range(16)]
    steps = f"""  - id: net
    stage: tn.build
    params: {{qaoa: {{nodes: {nodes}, p: 2, seed: {seed}}}}}
  - id: state
    stage: tn.statevector
    params: {{{qaoa}, bitstrings: {bitstrings}, open: [4, 5, 6, 7, 8, 9]}}
  - id: try
    stage: compress.evaluate
    inputs: {{x: state}}
    params: {{pipeline: quantized, error: 2.0e-2, threshold: 2.0e-2, maxcut: {{nodes: {nodes}, seed: {seed}}}}}
  - id: packed
    stage: compress
    inputs: {{x: state}}
    params: {{pipeline: quantized, error: 2.0e-2, threshold: 2.0e-2}}
"""
    run_dir = run_ok(tmp, spec_for(steps))
    with outputs(run_dir, "net") as f:
        edges = json.loads(f.attrs["circuit"])["graph_edges"]
    assert len(edges) == 3 * nodes // 2
    zz = "".join(f"""  - id: zz{k}
    stage: tn.statevector
    params: {{{qaoa}, pauli: 'Z{a} Z{b}'}}
""" for k, (a, b) in enumerate(edges))
    run_dir = run_ok(tmp, spec_for(steps + zz))  # the steps above are up to date
    pauli_sum = 0.0
    for k in range(len(edges)):
        with outputs(run_dir, f"zz{k}") as f:
            pauli_sum += complex(f["value"][()].ravel()[0]).real

    def energy(psi):
        psi = np.asarray(psi, dtype=np.complex128).ravel()
        idx = np.arange(psi.size)
        z = [1 - 2 * ((idx >> (nodes - 1 - q)) & 1) for q in range(nodes)]
        diag = sum(z[a] * z[b] for a, b in edges)
        p = np.abs(psi) ** 2
        return float(np.sum(p * diag) / np.sum(p))

    with outputs(run_dir, "state") as f:
        state = f["amplitudes"][...]
    with outputs(run_dir, "packed") as f:
        decoded = f["data"][...]
    with outputs(run_dir, "try") as f:
        e0, e1, rel = f["energy_original"][()], f["energy_decoded"][()], f["energy_relative_error"][()]
        assert json.loads(f.attrs["maxcut"])["edges"] == edges
    assert e0 == pytest.approx(pauli_sum, rel=1e-5, abs=1e-6)
    assert e0 == pytest.approx(energy(state), rel=1e-12)
    assert e1 == pytest.approx(energy(decoded), rel=1e-12)
    assert rel == pytest.approx(abs(e1 - e0) / abs(e0), rel=1e-12)
    assert 0 < rel < 0.05  # lossy, and within seed 003's 5 %
