"""End to end on the cpu backend: outputs against numpy oracles, provenance, reuse, reruns."""
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

import oracle
from conftest import DEVICE, chain_spec, ROOT, checksums, manifest, run, write_spec

SPEC = chain_spec("chain", 20000, 24, 16, 3, "{device_memory: 32MiB, max_batch_rows: 1000}", 1000)


@pytest.fixture
def chain(tmp):
    spec = write_spec(tmp / "chain.yaml", SPEC)
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    return spec, tmp / "run", r


def test_outputs_match_numpy(chain):
    _, run_dir, _ = chain
    out = run_dir / "outputs"
    with h5py.File(out / "psi.h5") as f:
        psi = f["data"][...]
        assert f["data"].dtype == np.complex64
        assert f["data"].chunks == (1000, 24)
        assert f["data"].attrs["qsum64"] == "%016x" % oracle.qsum64(psi)
    np.testing.assert_array_equal(psi, oracle.random_tensor((20000, 24), np.complex64, 3))
    with h5py.File(out / "gate.h5") as f:
        gate = f["data"][...]
    np.testing.assert_array_equal(gate, oracle.random_tensor((24, 16), np.complex64, 4))
    with h5py.File(out / "applied.h5") as f:
        c = f["data"][...]
    ref = psi.astype(np.complex128) @ gate.astype(np.complex128)
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-5
    with h5py.File(out / "summary.h5") as f:
        want = oracle.stats(c)
        assert f["norm"][()] == pytest.approx(want["sum_sq"] ** 0.5, rel=1e-12)
        assert f["min"][()] == want["min"] and f["max"][()] == want["max"]
        assert f["nonfinite"][()] == 0 and f["count"][()] == c.size
        assert f.attrs["input_checksum"] == "%016x" % want["checksum"]


def test_provenance_attributes(chain):
    _, run_dir, _ = chain
    with h5py.File(run_dir / "outputs" / "applied.h5") as f:
        a = dict(f.attrs)
    assert a["qstage.stage"] == "tensor.matmul"
    assert a["qstage.stage_version"] == 1
    assert json.loads(a["qstage.params"]) == {"chunk_rows": 0, "compute": "full"}
    inputs = json.loads(a["qstage.inputs"])
    assert set(inputs) == {"a", "b"} and all(len(v["hash"]) == 32 for v in inputs.values())
    assert a["qstage.version"]
    assert a["qstage.backend"] == DEVICE
    assert a["qstage.device"].startswith("CPU") == (DEVICE == "cpu")
    assert a["qstage.ranks"] == 1
    assert a["qstage.wall_seconds"] > 0
    assert 0 < a["qstage.peak_device_bytes"] <= 32 * 1024 * 1024
    assert a["qstage.step_key"] == manifest(run_dir)["steps"]["applied"]["key"]


def test_rerun_skips_and_touches_nothing(chain):
    spec, run_dir, _ = chain
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run_dir / "outputs").iterdir()}
    r = run(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
    assert r.code == 0, r
    assert r.err.count("up to date, skipped") == 4
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run_dir / "outputs").iterdir()}
    assert before == after


def test_changed_parameter_reruns_downstream_and_says_so(chain, tmp):
    spec, run_dir, _ = chain
    old = checksums(run_dir)
    write_spec(spec, SPEC.replace("seed: 4", "seed: 5"))
    r = run(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
    assert r.code == 0, r
    assert "step 'psi' (tensor.random): up to date, skipped" in r.err
    assert "step 'gate' (tensor.random): running (parameters changed: seed 4 -> 5)" in r.err
    assert "step 'applied' (tensor.matmul): running (inputs changed: input 'b'" in r.err
    assert "step 'summary' (tensor.stats): running (inputs changed: input 'x'" in r.err
    new = checksums(run_dir)
    assert new["psi"] == old["psi"] and new["gate"] != old["gate"] and new["applied"] != old["applied"]


def test_result_is_the_same_for_any_batch_size(chain, tmp):
    spec, run_dir, _ = chain
    r = run(["run", spec, "--run-dir", tmp / "big", "--device", DEVICE, "--device-memory", "64MiB"])
    assert r.code == 0, r
    assert checksums(tmp / "big") == checksums(run_dir)


def test_status_and_inspect(chain):
    _, run_dir, _ = chain
    r = run(["status", run_dir, "--json"])
    assert r.code == 0, r
    status = json.loads(r.out)
    assert [s["step"] for s in status["steps"]] == ["psi", "gate", "applied", "summary"]
    assert all(s["state"] == "done" and s["fraction"] == 1.0 for s in status["steps"])
    r = run(["status", run_dir])
    assert r.code == 0 and "applied" in r.out and "done" in r.out
    r = run(["inspect", run_dir / "outputs" / "applied.h5"])
    assert r.code == 0, r
    assert "qstage.stage" in r.out and "complex64" in r.out and "qsum64" in r.out


def test_output_layouts_match_their_schemas(chain):
    jsonschema = pytest.importorskip("jsonschema")
    _, run_dir, _ = chain
    for step, stage in [("psi", "tensor.random"), ("applied", "tensor.matmul"), ("summary", "tensor.stats")]:
        r = run(["inspect", run_dir / "outputs" / f"{step}.h5", "--json"])
        assert r.code == 0, r
        schema = json.loads((ROOT / "schemas" / "outputs" / f"{stage}.json").read_text())
        jsonschema.validate(json.loads(r.out), schema)


def test_output_schemas_are_the_ones_the_script_writes():
    """scripts/make_output_schemas.py is where a stage's layout is described: every schema it
    writes is the committed file's JSON (a hand edit to a schema would drift from it)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_output_schemas", ROOT / "scripts" / "make_output_schemas.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for stage, (description, attributes, datasets) in script.STAGES.items():
        committed = json.loads((ROOT / "schemas" / "outputs" / f"{stage}.json").read_text())
        assert script.schema(stage, description, attributes, datasets) == committed, (
            f"schemas/outputs/{stage}.json is not what scripts/make_output_schemas.py writes: run it")


def test_every_workflow_validates():
    for spec in sorted((ROOT / "workflows").glob("*.yaml")):
        r = run(["validate", spec])
        assert r.code == 0, (spec, r)


def test_embedded_quickstart_runs_in_the_current_directory(tmp):
    r = run(["run", "--device", DEVICE], cwd=tmp)
    assert r.code == 0, r
    run_dir = tmp / "qstage-runs" / "quickstart"
    assert set(checksums(run_dir)) == {"circuit", "path", "plan", "amplitudes", "reference", "check"}
    out = run_dir / "outputs"
    with h5py.File(out / "plan.h5") as f:
        assert f.attrs["slices"] > 1, "the 16 MiB budget must force slicing"
        assert f.attrs["arena_bytes"] <= 16 * 2**20
    with h5py.File(out / "amplitudes.h5") as f, h5py.File(out / "reference.h5") as g:
        a, s = f["amplitudes"][()], g["amplitudes"][()]
        assert (f["bitstrings"][()] == g["bitstrings"][()]).all() and a.shape == (4,)
    assert np.linalg.norm(a - s) / np.linalg.norm(s) < 1e-5
    with h5py.File(out / "check.h5") as f:
        assert f["relative_error"][()] < 1e-5 and f.attrs["rtol"] == 1e-5
    assert "within rtol" in r.err
    try:
        import jsonschema
    except ImportError:
        return  # test_output_layouts_match_their_schemas says it is skipped
    stages = {"circuit": "tn.build", "path": "tn.path", "plan": "tn.plan", "amplitudes": "tn.contract",
              "reference": "tn.statevector", "check": "tensor.compare"}
    for step, stage in stages.items():
        r = run(["inspect", out / f"{step}.h5", "--json"])
        assert r.code == 0, r
        jsonschema.validate(json.loads(r.out), json.loads((ROOT / "schemas" / "outputs" / f"{stage}.json").read_text()))


def test_two_runs_of_one_spec_give_every_step_the_same_key(tmp):
    """The quickstart (smaller: 20 qubits, 64 path trials, a 1 MiB budget that still slices) with
    a compress.evaluate step, run twice into two run directories: tn.plan measures the device's
    rates, tn.contract times its steps and compress.evaluate its codec, differently each time, yet
    every step gets the same key and the same content hash - measurements stay out of content
    identity, so nothing after them is recomputed."""
    text = (ROOT / "workflows" / "quickstart.yaml").read_text()
    for old, new in (("max_tries: 512", "max_tries: 64"), ("rows: 4, cols: 6", "rows: 4, cols: 5"),
                     ("budget: 16MiB", "budget: 1MiB")):
        assert old in text, old
        text = text.replace(old, new)
    text += """\
  - id: psi
    stage: tensor.random
    params: {shape: [4096, 64], dtype: complex64, seed: 7}
  - id: try
    stage: compress.evaluate
    inputs: {x: psi}
    params: {pipeline: quantized, error: 1.0e-3, threshold: 1.0e-3}
"""
    spec = write_spec(tmp / "quickstart.yaml", text)
    records = []
    for name in ("first", "second"):
        r = run(["run", spec, "--run-dir", tmp / name, "--device", DEVICE])
        assert r.code == 0, r
        records.append(manifest(tmp / name)["steps"])
    first, second = records
    assert set(first) == {"circuit", "path", "plan", "amplitudes", "reference", "check", "psi", "try"}
    for step in first:
        assert first[step]["key"] == second[step]["key"], step
        assert first[step].get("content") == second[step].get("content"), step
    # (what made the keys differ before: measured anew, and recorded with their checksums)
    assert first["plan"]["measured"] == ["prediction", "steps/predicted_seconds"]
    assert first["amplitudes"]["measured"] == ["step_of_roofline", "step_roofline_seconds", "step_seconds"]
    assert first["try"]["measured"] == ["compress_gbps", "decompress_gbps"]
    assert first["plan"]["checksums"]["prediction"] != second["plan"]["checksums"]["prediction"]
    with h5py.File(tmp / "first" / "outputs" / "plan.h5") as f:
        assert f.attrs["slices"] > 1


def test_a_later_step_sees_streamed_rows_change_when_the_stages_own_datasets_do_not(tmp):
    """tn.statevector streams its amplitudes and writes the bitstrings itself; another circuit
    with the same bitstrings changes only the streamed rows, and the step that reads them must
    run again (its input's content covers every dataset, not only those the stage wrote)."""
    spec_text = """
name: stale
steps:
  - id: sv
    stage: tn.statevector
    params:
      random: {rows: 3, cols: 3, cycles: 8, seed: SEED}
      bitstrings: ['000000000', '101010101', '111111111']
  - id: stats
    stage: tensor.stats
    inputs: {x: sv}
"""
    run_dir = tmp / "run"
    stats = []
    for seed in (1, 2):
        spec = write_spec(tmp / "spec.yaml", spec_text.replace("SEED", str(seed)))
        r = run(["run", spec, "--run-dir", run_dir, "--device", DEVICE])
        assert r.code == 0, r
        with h5py.File(run_dir / "outputs" / "sv.h5") as f:
            amplitudes = f["amplitudes"][()]
        with h5py.File(run_dir / "outputs" / "stats.h5") as f:
            stats.append({k: f[k][()] for k in f})
        # the stats are of the amplitudes the run directory holds now
        norm = next(v for k, v in stats[-1].items() if "norm" in k)
        assert np.isclose(float(np.ravel(norm)[0]), np.linalg.norm(amplitudes), rtol=1e-6), (stats[-1], amplitudes)
    assert "step 'stats' (tensor.stats): running (inputs changed" in r.err, r.err


def test_streaming_matmul_example_respects_its_budget(tmp):
    r = run(["run", ROOT / "workflows" / "streaming-matmul.yaml", "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    assert set(checksums(tmp / "run")) == {"psi", "gate", "applied", "summary"}
    with h5py.File(tmp / "run" / "outputs" / "applied.h5") as f:
        assert f["data"].shape == (1048576, 64)
        # The device budget (128 MiB) was a quarter of the streamed tensor, and it was respected.
        assert f.attrs["qstage.peak_device_bytes"] <= 128 * 2**20


def test_help_and_version():
    r = run(["--help"])
    assert r.code == 0 and "exit codes" in r.out and "resume" in r.out
    for cmd in ["run", "resume", "status", "inspect", "validate", "stages"]:
        r = run([cmd, "--help"])
        assert r.code == 0 and "examples:" in r.out, (cmd, r)
    r = run(["--version"])
    assert r.code == 0 and r.out.startswith("qstage ")
    r = run(["stages", "tensor.matmul"])
    assert r.code == 0 and "compute" in r.out and "3xtf32" in r.out and 'default "full"' in r.out
    # Every stage's parameters print, whatever their schema's type says (a list of types too).
    listed = [line.split() for line in run(["stages"]).out.splitlines()]
    names = [words[0] for words in listed if len(words) > 1 and words[1].startswith("v")]  # "NAME  vN  summary"
    assert "tn.build" in names
    for name in names:
        r = run(["stages", name])
        assert r.code == 0 and "parameters:" in r.out, (name, r)
    assert "simplify     boolean or list of one of" in run(["stages", "tn.build"]).out


def test_the_qsum64_snippet_in_the_docs_is_right(chain):
    """docs/outputs.md's numpy code recomputes a file's checksum attribute."""
    text = (ROOT / "docs" / "outputs.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(code, namespace)
    _, run_dir, _ = chain
    with h5py.File(run_dir / "outputs" / "applied.h5") as f:
        assert namespace["qsum64"](f["data"][...]) == f["data"].attrs["qsum64"]


def test_compression_example_runs(tmp):
    r = run(["run", ROOT / "workflows" / "compression.yaml", "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    out = tmp / "run" / "outputs"
    with h5py.File(out / "psi.h5") as x, h5py.File(out / "unpacked.h5") as y, h5py.File(out / "packed.h5") as p:
        a, b = x["data"][...], y["data"][...]
        bound = max(p["data"].attrs["codec.error"], p["data"].attrs["codec.threshold"])
        assert p.attrs["compress.ratio"] > 1
    assert max(np.abs(a.real - b.real).max(), np.abs(a.imag - b.imag).max()) <= bound
    with h5py.File(out / "try.h5") as e:
        assert e["beyond_bound"][()] == 0 and e["ratio"][()] > 1
    with h5py.File(out / "zz.h5") as z:
        assert z.attrs["spilled_raw_bytes"] > 0 and 0 < z.attrs["reference_relative_error"] < 0.05
    with h5py.File(out / "amps.h5") as s:
        assert s["amplitudes"].attrs["codec.pipeline"] == "quantized" and s["amplitudes"].shape == (4096,)
        assert s["amplitudes"].attrs["codec.stored_bytes"] < s["amplitudes"].size * 8
