"""The layers (cmake/layers.json, the table the build reads too), the stage families among them:
every source file belongs to the layer that owns its folder, and includes only that layer's folders and what it sees (a layer's
name: that layer and everything below it; a path: that alone). The build enforces the same with
an include root per layer (cmake/layers.cmake); this test names the offending line. The lowest
layers pull in no HDF5 or MPI headers."""
import json
import re
import subprocess

from conftest import ROOT

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
SOURCE_SUFFIXES = (".hpp", ".cpp", ".cu", ".cuh", ".h")
TABLE = json.loads((ROOT / "cmake" / "layers.json").read_text())["layers"]
LAYERS = {layer["name"]: layer for layer in TABLE}
# Outside the layers: tests and benchmarks may include any layer (they link qstage_core).
OUTSIDE = ("tests/", "bench/")
# System headers the lowest layers must not pull in (kernels need only the element types).
FORBIDDEN_SYSTEM = {"hdf5.h", "mpi.h", "H5Zpublic.h"}
NO_SYSTEM_IN = ("backend", "kernels")  # (core/mpi.hpp wraps MPI: core may)


def visible(name, seen=None):
    """What layer `name` may include: its folders and, recursively, what it sees."""
    seen = set() if seen is None else seen
    layer = LAYERS[name]
    out = set(layer["folders"])
    for entry in layer["sees"]:
        if entry in LAYERS:
            if entry not in seen:
                seen.add(entry)
                out |= visible(entry, seen)
        else:
            out.add(entry)
    return out


def owner(path):
    """The layer owning `path` (the one with the longest folder that holds it), or None."""
    best, length = None, -1
    for layer in TABLE:
        for folder in layer["folders"]:
            if (path == folder or path.startswith(folder + "/")) and len(folder) > length:
                best, length = layer["name"], len(folder)
    return best


def sources():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [f for f in files if f.endswith(SOURCE_SUFFIXES) and not f.startswith(OUTSIDE)]


def includes(path):
    for kind, name in INCLUDE.findall((ROOT / path).read_text(errors="replace")):
        yield kind, name


def allowed(name, roots):
    return any(name == r or name.startswith(r + "/") for r in roots)


def test_the_table_names_existing_folders_and_layers():
    for layer in TABLE:
        for folder in layer["folders"]:
            assert (ROOT / folder).is_dir(), (layer["name"], folder)
        for entry in layer["sees"]:
            assert entry in LAYERS or (ROOT / entry).exists(), (layer["name"], entry)


def test_every_source_file_belongs_to_a_layer():
    stray = [f for f in sources() if owner(f) is None]
    assert not stray, "source files outside every layer's folders (cmake/layers.json):\n" + "\n".join(stray)


def test_each_layer_includes_only_what_it_sees():
    wrong = []
    roots = {name: visible(name) for name in LAYERS}
    for path in sources():
        layer = owner(path)
        for kind, name in includes(path):
            if kind == '"' and "/" in name and not allowed(name, roots[layer]):
                wrong.append(f"{path} ({layer}) includes {name} (it sees: {', '.join(sorted(roots[layer]))})")
    assert not wrong, "\n".join(wrong)


def test_a_layer_that_includes_a_higher_one_fails_here():
    """The check itself: a kernel including io/h5.hpp, or a stage the runner, is refused."""
    assert not allowed("io/h5.hpp", visible("kernels"))
    assert not allowed("runner/runner.hpp", visible("stages"))
    assert not allowed("stages/common/stage.hpp", visible("nnqs_model"))
    assert allowed("stages/nnqs/network.hpp", visible("nnqs_model"))
    assert allowed("codec/codec.hpp", visible("engine")) and allowed("core/error.hpp", visible("cli"))
    # families see only the families they declare: sci sees keys, not the other way round
    assert allowed("stages/keys/dedup_passes.hpp", visible("stages_sci"))
    assert not allowed("stages/sci/problem.hpp", visible("stages_keys"))
    assert not allowed("stages/compress/common.hpp", visible("stages_tn"))
    assert not allowed("stages/mps/tebd.hpp", visible("stages_sci"))


def test_kernels_and_backend_need_no_hdf5_or_mpi_headers():
    wrong = [f"{path} includes <{name}>" for path in sources() if owner(path) in NO_SYSTEM_IN
             for kind, name in includes(path) if kind == "<" and name in FORBIDDEN_SYSTEM]
    assert not wrong, "\n".join(wrong)
