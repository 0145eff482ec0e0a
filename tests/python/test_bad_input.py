"""Bad input: a one-line error naming the thing and what was expected, exit code 2, and nothing
already committed is touched (every file of an earlier run keeps its bytes)."""
import h5py
import numpy as np
import pytest

from conftest import DEVICE, one_line_error, run, tree_digest, write_spec

GOOD = """
name: chain
options: {device_memory: 32MiB}
steps:
  - id: psi
    stage: tensor.random
    params: {shape: [4000, 8], dtype: complex64, seed: 1}
  - id: gate
    stage: tensor.random
    params: {shape: [8, 8], dtype: complex64, seed: 2}
  - id: applied
    stage: tensor.matmul
    inputs: {a: psi, b: gate}
"""


@pytest.fixture
def committed(tmp):
    spec = write_spec(tmp / "good.yaml", GOOD)
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE])
    assert r.code == 0, r
    with h5py.File(tmp / "ints.h5", "w") as f:
        f["i"] = np.arange(10, dtype=np.int32)
        f["cube"] = np.zeros((4, 4, 4), dtype=np.complex64)
        f["s"] = np.array([b"ab", b"cd"])
        f.create_dataset("plain", data=np.zeros((8, 4), np.float32), chunks=(4, 4))
    (tmp / "text.h5").write_text("not an HDF5 file")
    return tmp


SPEC_CASES = {
    "malformed yaml": ("name: chain\nsteps: [\n", ["bad.yaml:", "malformed YAML"]),
    "unknown stage": (GOOD.replace("tensor.matmul", "tensor.matmull"),
                      ["unknown stage 'tensor.matmull'", "did you mean 'tensor.matmul'"]),
    "unknown parameter": (GOOD.replace("seed: 1}", "seed: 1, sed: 2}"), ["steps[0].params.sed", "unknown key"]),
    "wrong parameter type": (GOOD.replace("seed: 1", "seed: one"), ["steps[0].params.seed", "expected an integer"]),
    "missing input": (GOOD.replace("inputs: {a: psi, b: gate}", "inputs: {a: psi}"), ["missing input 'b'"]),
    "shape mismatch": (GOOD.replace("shape: [8, 8]", "shape: [9, 8]"), ["input 'b' has 9 rows; expected 8"]),
    "missing file": (GOOD + "  - id: s\n    stage: tensor.stats\n    inputs: {x: {file: nowhere.h5, dataset: d}}\n",
                     ["nowhere.h5' does not exist", "expected an HDF5 file"]),
    "not hdf5": (GOOD + "  - id: s\n    stage: tensor.stats\n    inputs: {x: {file: text.h5, dataset: d}}\n",
                 ["is not an HDF5 file"]),
    "missing dataset": (GOOD + "  - id: s\n    stage: tensor.stats\n    inputs: {x: {file: ints.h5, dataset: /nope}}\n",
                        ["has no dataset '/nope'", "datasets in it: /cube, /i, /plain, /s"]),
    "wrong dtype": (GOOD + "  - id: s\n    stage: tensor.stats\n    inputs: {x: {file: ints.h5, dataset: /i}}\n",
                    ["input 'x' has dtype int32; expected float32, float64, complex64 or complex128"]),
    "string dataset": (GOOD + "  - id: s\n    stage: tensor.stats\n    inputs: {x: {file: ints.h5, dataset: /s}}\n",
                       ["element type string"]),
    "wrong rank": (GOOD + "  - id: m\n    stage: tensor.matmul\n    inputs: {a: {file: ints.h5, dataset: /cube}, b: gate}\n",
                   ["input 'a' has shape [4, 4, 4]; expected a matrix"]),
    "compress wrong dtype": (GOOD + "  - id: c\n    stage: compress\n    inputs: {x: {file: ints.h5, dataset: /i}}\n",
                             ["input 'x' has dtype int32; expected float32 or complex64"]),
    "compress unknown pipeline": (GOOD + "  - id: c\n    stage: compress\n    inputs: {x: psi}\n    params: {pipeline: zfp}\n",
                                  ["steps[3].params.pipeline"]),
    "compress negative bound": (GOOD + "  - id: c\n    stage: compress\n    inputs: {x: psi}\n    params: {error: -1}\n",
                                ["steps[3].params.error"]),
    "decompress unfiltered": (GOOD + "  - id: d\n    stage: decompress\n    inputs: {x: {file: ints.h5, dataset: /plain}}\n",
                              ["input 'x' has the filter pipeline []; expected qstage's codec alone ([32881])"]),
    "decompress contiguous": (GOOD + "  - id: d\n    stage: decompress\n    inputs: {x: {file: ints.h5, dataset: /cube}}\n",
                              ["input 'x' is not chunked; expected a chunked dataset of compressed chunks"]),
    # A budget of 0 was taken as "the default" (no limit asked for is not what 0 says).
    "zero budget": (GOOD.replace("device_memory: 32MiB", "device_memory: 0B"),
                    ["options.device_memory: '0B' is a budget of 0 bytes", "expected a positive size"]),
    "budget too small": (GOOD.replace("device_memory: 32MiB", "device_memory: 1KiB"),
                         ["device memory budget 1.00 KiB is too small", "needs", "--device-memory"]),
    # Absurd sizes: a size that overflows, and an output no file system holds (these ended in
    # "internal error: std::bad_alloc" after minutes, or in an HDF5 chunk error).
    "size overflow": (GOOD.replace("shape: [4000, 8]", "shape: [4294967296, 4294967296, 4294967296]"),
                      ["output 'data' of shape [4294967296, 4294967296, 4294967296] (complex64)",
                       "more than 2^63 bytes"]),
    "larger than the file system": ("name: chain\nsteps:\n  - id: psi\n    stage: tensor.random\n"
                                    "    params: {shape: [1000000000000, 1000000]}\n",
                                    ["step 'psi' (tensor.random): output 'data'", "7105 PiB",
                                     "more than the whole file system of the run directory"]),
}
# Checked when a run starts (the run directory's file system, the device budget), not by validate.
RUN_ONLY = {"budget too small", "larger than the file system"}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_bad_spec_leaves_committed_run_untouched(committed, case):
    text, fragments = SPEC_CASES[case]
    spec = write_spec(committed / "bad.yaml", text)
    before = tree_digest(committed / "run")
    r = run(["run", spec, "--run-dir", committed / "run", "--device", DEVICE])
    one_line_error(r, *fragments)
    assert tree_digest(committed / "run") == before
    # validate reports the same problem
    if case not in RUN_ONLY:
        one_line_error(run(["validate", spec]), *fragments)


def test_run_dir_of_another_spec(committed):
    spec = write_spec(committed / "other.yaml", GOOD.replace("name: chain", "name: other"))
    before = tree_digest(committed / "run")
    r = run(["run", spec, "--run-dir", committed / "run", "--device", DEVICE])
    one_line_error(r, "holds workflow 'chain'", "this spec is workflow 'other'")
    assert tree_digest(committed / "run") == before


def test_foreign_directory_is_refused(committed):
    (committed / "foreign").mkdir()
    (committed / "foreign" / "thesis.tex").write_text("precious")
    spec = committed / "good.yaml"
    one_line_error(run(["run", spec, "--run-dir", committed / "foreign", "--device", DEVICE]),
                   "exists, is not empty and has no manifest.json")
    assert (committed / "foreign" / "thesis.tex").read_text() == "precious"


@pytest.mark.parametrize("args,fragments", [
    (["--device", "tpu"], ["--device: unknown device 'tpu'"]),
    (["--device-memory", "lots"], ["--device-memory: 'lots' is not a size"]),
    (["--device-memory", "0"], ["--device-memory: '0' is a budget of 0 bytes", "expected a positive size"]),
    (["--host-memory", "0GiB"], ["--host-memory: '0GiB' is a budget of 0 bytes", "expected a positive size"]),
    (["--checkpoint-interval", "soon"], ["'soon' is not a duration"]),
    (["--slots", "1"], ["--slots 1: expected at least 2"]),
    (["--bind", "socket"], ["--bind socket: expected gpu or none"]),
    (["--log-level", "loud"], ["unknown level 'loud'"]),
    (["--frobnicate"], ["unrecognised option '--frobnicate'"]),
])
def test_bad_options(committed, args, fragments):
    before = tree_digest(committed / "run")
    base = ["run", committed / "good.yaml", "--run-dir", committed / "run"]
    r = run(base + (args if args[0] == "--device" else ["--device", DEVICE] + args))
    one_line_error(r, *fragments)
    assert tree_digest(committed / "run") == before


def test_validate_refuses_a_zero_budget(committed):
    for option in ["--device-memory", "--host-memory"]:
        one_line_error(run(["validate", committed / "good.yaml", option, "0"]),
                       f"{option}: '0' is a budget of 0 bytes", "expected a positive size")


def test_cuda_without_gpu_is_bad_input(committed):
    r = run(["--version"])
    if "built without CUDA" not in r.out:
        pytest.skip("this build has CUDA; the GPU machine runs the GPU paths instead")
    one_line_error(run(["run", committed / "good.yaml", "--run-dir", committed / "r2", "--device", "cuda"]),
                   "--device cuda")


def test_other_commands_reject_bad_input(committed):
    one_line_error(run(["run", committed / "missing.yaml"]), "missing.yaml' does not exist")
    one_line_error(run(["resume", committed]), "has no manifest.json")
    one_line_error(run(["status", committed / "nowhere"]), "has no manifest.json")
    one_line_error(run(["inspect", committed / "text.h5"]), "is not an HDF5 file")
    one_line_error(run(["inspect", committed / "absent.h5"]), "does not exist")
    one_line_error(run(["stages", "tensor.nope"]), "unknown stage 'tensor.nope'")
    one_line_error(run(["frobnicate"]), "unknown command 'frobnicate'")


def test_a_run_killed_before_its_manifest_can_start_again(committed):
    """A kill between creating the run directory and writing its manifest leaves only qstage's
    own skeleton; `qstage run` takes such a directory as new."""
    d = committed / "half"
    for sub in ["outputs", "steps", "logs"]:
        (d / sub).mkdir(parents=True)
    (d / "logs" / "rank-0.log").write_text("started\n")
    (d / "manifest.json.tmp").write_text("{")
    r = run(["run", committed / "good.yaml", "--run-dir", d, "--device", DEVICE])
    assert r.code == 0, r
    assert (d / "manifest.json").exists()
