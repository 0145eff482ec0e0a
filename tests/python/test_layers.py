"""The layers, as far as they hold today (issue 17 builds the rest): each folder below may include
only the folders listed for it, and the lowest layers no HDF5 or MPI headers. A file that
includes a layer above its own fails here, before it becomes a habit."""
import re

from conftest import ROOT

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
SOURCES = ("*.hpp", "*.cpp", "*.cu", "*.cuh", "*.h")

# folder -> the include roots it may use (its own included). The build enforces the same with an
# include root per layer (cmake/layers.cmake); this test says it in one place, for readers.
# kernels see the codec's format (io/codec), the one part of io below them; the codec sees only
# core's QSTAGE_HD. The stages see the spec's schema, not its workflow (which binds stages).
ALLOWED = {
    "src/core": {"core"},
    "io/codec": {"core/hd.hpp", "io/codec"},
    "src/backend": {"core", "backend"},
    "kernels": {"core", "backend", "kernels", "io/codec"},
    "io": {"core", "backend", "kernels", "io"},
    # Exchange between ranks: above the backend (it takes its buffers and streams), below the
    # engine, whose exchange phase and the stages use it.
    "src/comm": {"core", "backend", "comm"},
    "src/engine": {"core", "backend", "kernels", "io", "comm", "engine"},
    "stages": {"core", "backend", "kernels", "io", "comm", "engine", "spec/schema.hpp", "spec/document.hpp",
               "stages"},
    # sci.nnqs's LibTorch plugin (a module of its own, stages/nnqs/network.hpp): the interface it
    # implements and nothing else of qstage.
    "stages/nnqs/model": {"stages/nnqs/network.hpp", "stages/nnqs/model"},
}
# System headers the lowest layers must not pull in (kernels need only the element types).
FORBIDDEN_SYSTEM = {"hdf5.h", "mpi.h", "H5Zpublic.h"}
NO_SYSTEM_IN = ("src/backend", "kernels")  # (core/mpi.hpp wraps MPI: core may)


def includes(folder):
    for pattern in SOURCES:
        for path in (ROOT / folder).rglob(pattern):
            for kind, name in INCLUDE.findall(path.read_text(errors="replace")):
                yield path.relative_to(ROOT), kind, name


def allowed(name, roots):
    return any(name == r or name.startswith(r + "/") for r in roots)


def test_each_layer_includes_only_the_layers_below_it():
    wrong = []
    for folder, roots in ALLOWED.items():
        assert (ROOT / folder).is_dir(), folder
        for path, kind, name in includes(folder):
            if kind == '"' and "/" in name and not allowed(name, roots):
                wrong.append(f"{path} includes {name} (allowed: {', '.join(sorted(roots))})")
    assert not wrong, "\n".join(wrong)


def test_kernels_and_backend_need_no_hdf5_or_mpi_headers():
    wrong = [f"{path} includes <{name}>" for folder in NO_SYSTEM_IN for path, kind, name in includes(folder)
             if kind == "<" and name in FORBIDDEN_SYSTEM]
    assert not wrong, "\n".join(wrong)


def test_nothing_but_the_cli_includes_the_cli():
    wrong = [f"{path} includes {name}" for folder in ("src/core", "src/backend", "kernels", "io", "src/comm",
                                                      "src/engine", "src/runner", "src/spec", "stages")
             for path, kind, name in includes(folder) if kind == '"' and name.startswith("cli/")]
    assert not wrong, "\n".join(wrong)
