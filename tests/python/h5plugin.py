"""Makes h5py find qstage's HDF5 filter plugin: QSTAGE_H5Z_DIR (set by tests/CMakeLists.txt and
bench/gpu_run.sh) names the folder with libh5z_qstage.so. Import this before h5py; a test module
that imports it is skipped, visibly, where the plugin was not built."""
import os
from pathlib import Path

import pytest

PLUGIN_DIR = os.environ.get("QSTAGE_H5Z_DIR")
if not PLUGIN_DIR or not (Path(PLUGIN_DIR) / "libh5z_qstage.so").is_file():
    pytest.skip(f"QSTAGE_H5Z_DIR ({PLUGIN_DIR!r}) does not hold libh5z_qstage.so: build the qstage_h5z target",
                allow_module_level=True)
# HDF5 reads HDF5_PLUGIN_PATH when it sets up its plugin search path, so before h5py loads it;
# h5dump and h5repack inherit it. Where h5py came first (several test files in one process), the
# directory is added to the live search path below.
os.environ["HDF5_PLUGIN_PATH"] = PLUGIN_DIR

import h5py  # noqa: E402

if PLUGIN_DIR.encode() not in [h5py.h5pl.get(i) for i in range(h5py.h5pl.size())]:
    h5py.h5pl.prepend(PLUGIN_DIR.encode())
