"""The HDF5 filter plugin libh5z_qstage.so (filter 32881, io/filter/h5z_filter.cpp): h5py, h5dump
and h5repack write and read qstage-compressed chunks through it, every decoded value stays within
max(t, e) of the original, and bad chunks or bad cd_values fail loudly instead of giving garbage."""
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from h5plugin import PLUGIN_DIR  # before h5py: it sets HDF5_PLUGIN_PATH
from oracle import spiky

import h5py  # noqa: E402

FILTER_ID = 32881
PIPELINES = ["szx", "threshold", "group", "group2l", "integrated", "quantized"]


def cd_values(etype, pipeline, block, relative, t, e):
    """The filter's 9 cd_values: version 1, element type (0 float32, 1 complex64), pipeline, block
    size, flags (bit 0: relative), then t and e as doubles, each as (low, high) 32-bit words."""
    t_lo, t_hi = struct.unpack("<II", struct.pack("<d", t))
    e_lo, e_hi = struct.unpack("<II", struct.pack("<d", e))
    p = PIPELINES.index(pipeline) if isinstance(pipeline, str) else pipeline
    return (1, etype, p, block, 1 if relative else 0, t_lo, t_hi, e_lo, e_hi)


def stream_header(raw):
    """The fixed header of a qstage stream (codec/stream.cpp) and the first shape extent."""
    magic, version, etype, pipeline, block, rank, flags, _, rng, t, e, t_given, e_given, payload, _ = \
        struct.unpack_from("<4sHBBIBBHdddddQQ", raw)
    extent = struct.unpack_from("<Q", raw, 72)[0] if rank else None
    return dict(magic=magic, version=version, type=etype, pipeline=pipeline, block=block, rank=rank,
                relative=bool(flags & 1), range=rng, t=t, e=e, t_given=t_given, e_given=e_given,
                payload=payload, extent=extent)


def padded_chunks(x, chunk):
    """The chunks the filter sees: an edge chunk is padded to full size with the fill value 0."""
    for start in range(0, x.size, chunk):
        part = x[start:start + chunk]
        yield start, np.concatenate([part, np.zeros(chunk - part.size, x.dtype)])


def finite_range(v):
    f = v[np.isfinite(v)]
    return float(np.float64(f.max()) - np.float64(f.min())) if f.size else 0.0


def assert_within(decoded, original, bound):
    d = np.abs(decoded.astype(np.float64) - original.astype(np.float64))
    bad = np.flatnonzero(~(d <= bound))
    assert bad.size == 0, (f"{bad.size} values off by more than {bound!r}; first at {bad[0]}: "
                           f"{original.flat[bad[0]]!r} -> {decoded.flat[bad[0]]!r}")


def chunk_streams(dset):
    """(filter mask, bytes) of every chunk of a 1-D dataset."""
    return [dset.id.read_direct_chunk((start,)) for start in range(0, dset.shape[0], dset.chunks[0])]


def write(path, data, opts, chunks, name="x"):
    with h5py.File(path, "w") as f:
        f.create_dataset(name, data=data, chunks=chunks, compression=FILTER_ID, compression_opts=opts)


def read(path, name="x"):
    with h5py.File(path, "r") as f:
        return f[name][...]


def test_plugin_loads_without_a_second_hdf5(tmp_path):
    assert h5py.h5z.filter_avail(FILTER_ID)
    write(tmp_path / "a.h5", np.arange(100, dtype=np.float32), cd_values(0, "szx", 64, False, 0, 0), (50,))
    with h5py.File(tmp_path / "a.h5", "r") as f:
        code, _, values, name = f["x"].id.get_create_plist().get_filter(0)
        assert code == FILTER_ID and b"qstage" in name and len(values) == 9
        assert np.array_equal(f["x"][...], np.arange(100, dtype=np.float32))
    maps = Path("/proc/self/maps")
    if maps.exists():  # the plugin must not bring its own libhdf5 (it calls no HDF5 function)
        mapped = {l.split()[-1] for l in maps.read_text().splitlines() if "/" in l}
        assert any(m.endswith("/libh5z_qstage.so") for m in mapped)
        # Debian names it libhdf5_serial.so.103; h5py's own wheels bundle libhdf5-<hash>.so.<version>.
        libs = {m for m in mapped if re.search(r"/libhdf5[^/]*\.so", m) and "_hl" not in m.rsplit("/", 1)[-1]}
        assert len(libs) == 1, libs


@pytest.mark.parametrize("block", [64, 256])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_float32_relative_bounds_per_chunk(tmp_path, pipeline, block):
    rng = np.random.default_rng(PIPELINES.index(pipeline) * 1000 + block)
    n, chunk = 50_000, 8192  # 7 chunks, the last one partial
    x = spiky(rng, n)
    t, e = (0.0 if pipeline == "szx" else 1e-3), 5e-4
    path = tmp_path / "f.h5"
    write(path, x, cd_values(0, pipeline, block, True, t, e), (chunk,))
    with h5py.File(path, "r") as f:
        dset = f["x"]
        y = dset[...]
        assert y.dtype == np.float32 and y.shape == x.shape
        storage, streams = dset.id.get_storage_size(), chunk_streams(dset)
    assert not np.array_equal(x, y)  # lossy for these bounds
    assert len(streams) == 7
    for (start, seen), (mask, raw) in zip(padded_chunks(x, chunk), streams):
        assert mask == 0, f"the optional filter was skipped for the chunk at {start}"
        h = stream_header(raw)
        assert h["magic"] == b"QSTZ" and h["pipeline"] == PIPELINES.index(pipeline) and h["block"] == block
        assert h["relative"] and h["extent"] == chunk and h["t_given"] == t and h["e_given"] == e
        r = finite_range(seen)
        assert h["range"] == r and h["t"] == t * r and h["e"] == e * r  # the chunk's own range
        part = slice(start, min(start + chunk, n))
        assert_within(y[part], x[part], max(t, e) * r)
    if pipeline == "group":
        assert storage < x.nbytes / 2, (storage, x.nbytes)
        assert path.stat().st_size < x.nbytes


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_complex64_absolute_bounds(tmp_path, pipeline):
    rng = np.random.default_rng(7 + PIPELINES.index(pipeline))
    shape, chunks = (40, 75), (16, 32)  # 2-D, partial chunks on both axes
    env = spiky(rng, shape[0] * shape[1]).reshape(shape)
    z = (env * (rng.standard_normal(shape) + 1j * rng.standard_normal(shape))).astype(np.complex64)
    t = 0.0 if pipeline == "szx" else 1e-3
    path = tmp_path / "c.h5"
    write(path, z, cd_values(1, pipeline, 128, False, t, 1e-3), chunks)
    with h5py.File(path, "r") as f:
        w = f["x"][...]
        mask, raw = f["x"].id.read_direct_chunk((0, 0))
    assert mask == 0 and stream_header(raw)["type"] == 1 and stream_header(raw)["extent"] == 16 * 32
    assert w.dtype == np.complex64 and w.shape == shape
    assert_within(w.real, z.real, 1e-3)
    assert_within(w.imag, z.imag, 1e-3)
    assert not np.array_equal(w, z)


def _special(rng):
    x = rng.standard_normal(700).astype(np.float32)
    x[[3, 100, 650]] = np.nan
    x[[5, 300]] = np.inf
    x[[6, 699]] = -np.inf
    return x


CASES = {
    "one element": (lambda rng: np.array([1.5], np.float32), 1),
    "one 64-value chunk": (lambda rng: rng.standard_normal(64).astype(np.float32), 64),
    "all zero": (lambda rng: np.zeros(1000, np.float32), 256),
    "constant": (lambda rng: np.full(1000, 3.25, np.float32), 256),
    "nan and inf": (_special, 256),
}


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("case", list(CASES))
def test_small_and_special_data(tmp_path, case, pipeline):
    make, chunk = CASES[case]
    x = make(np.random.default_rng(3))
    t, e = (0.0 if pipeline == "szx" else 1e-2), 1e-3
    write(tmp_path / "s.h5", x, cd_values(0, pipeline, 64, True, t, e), (chunk,))
    y = read(tmp_path / "s.h5")
    assert y.shape == x.shape
    finite = np.isfinite(x)
    assert np.array_equal(np.isnan(y), np.isnan(x))
    assert np.array_equal(y[np.isinf(x)], x[np.isinf(x)])
    for start, seen in padded_chunks(x, chunk):
        part = slice(start, start + chunk)
        assert_within(y[part][finite[part]], x[part][finite[part]], max(t, e) * finite_range(seen))
    if case in ("one element", "all zero", "constant"):  # range 0: relative bounds keep every bit
        assert np.array_equal(y.view(np.uint32), x.view(np.uint32))


def _tool(name):
    exe = shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} not found (Debian package hdf5-tools)")
    return exe


def test_h5dump_reads_through_the_plugin(tmp_path):
    exe = _tool("h5dump")
    x = np.array([0.5, -1.25, 3, 1024, -0.0625, 7.75, 100.5, -2], np.float32)
    write(tmp_path / "d.h5", x, cd_values(0, "integrated", 64, False, 0, 0), (4,))
    r = subprocess.run([exe, "-p", "-d", "/x", str(tmp_path / "d.h5")], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, HDF5_PLUGIN_PATH=PLUGIN_DIR))
    assert r.returncode == 0, r
    assert "32881" in r.stdout and "qstage" in r.stdout, r.stdout
    data = r.stdout.split("DATA {", 1)[1].split("}", 1)[0]
    printed = [float(v) for v in re.sub(r"\(\d+\):", " ", data).replace(",", " ").split()]
    assert printed == x.tolist(), r.stdout


def test_h5repack_writes_through_the_plugin(tmp_path):
    exe = _tool("h5repack")
    x = spiky(np.random.default_rng(11), 4500)
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["dset"] = x
    t, e = 1e-3, 2e-4
    ud = ",".join(map(str, (FILTER_ID, 0, 9) + cd_values(0, "integrated", 256, True, t, e)))
    r = subprocess.run([exe, "-l", "dset:CHUNK=1000", "-f", f"dset:UD={ud}", str(tmp_path / "plain.h5"),
                        str(tmp_path / "packed.h5")], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, HDF5_PLUGIN_PATH=PLUGIN_DIR))
    assert r.returncode == 0, r
    with h5py.File(tmp_path / "packed.h5", "r") as f:
        dset = f["dset"]
        assert dset.chunks == (1000,)
        code, flags, values, _ = dset.id.get_create_plist().get_filter(0)
        assert code == FILTER_ID and flags & h5py.h5z.FLAG_OPTIONAL == 0
        assert tuple(values) == cd_values(0, "integrated", 256, True, t, e)
        y = dset[...]
        streams = chunk_streams(dset)
    assert all(mask == 0 and raw[:4] == b"QSTZ" for mask, raw in streams)
    for start, seen in padded_chunks(x, 1000):
        assert_within(y[start:start + 1000], x[start:start + 1000], max(t, e) * finite_range(seen))
    assert not np.array_equal(x, y)


@pytest.fixture
def compressed(tmp_path):
    """A file with one compressed dataset 'x' of 3 chunks, and the data written."""
    x = spiky(np.random.default_rng(5), 3000)
    write(tmp_path / "c.h5", x, cd_values(0, "group", 128, True, 1e-3, 1e-3), (1000,))
    return tmp_path / "c.h5", x


def _flip_in_file(path, offset, size):
    with open(path, "r+b") as fh:
        for at in (offset + size // 2, offset + size - 1):
            fh.seek(at)
            b = fh.read(1)
            fh.seek(at)
            fh.write(bytes([b[0] ^ 0x5A]))


def test_corrupted_chunk_on_disk_fails_to_read(compressed, capfd):
    path, x = compressed
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info(1)
        assert info.filter_mask == 0
    _flip_in_file(path, info.byte_offset, info.size)
    with h5py.File(path, "r") as f:
        assert_within(f["x"][:1000], x[:1000], 1e-3 * finite_range(x[:1000]))  # chunk 0 is intact
        with pytest.raises(OSError):
            f["x"][...]
        with pytest.raises(OSError):
            f["x"][1000:2000]
        assert_within(f["x"][2000:], x[2000:], 1e-3 * finite_range(x[2000:]))  # other chunks still read
    err = capfd.readouterr().err
    assert "qstage HDF5 filter: decoding" in err and "checksum" in err, err


@pytest.mark.parametrize("damage", ["flip", "truncate", "not a stream", "version 2"])
def test_bad_direct_chunks_fail_to_read(compressed, damage, capfd):
    path, x = compressed
    with h5py.File(path, "a") as f:
        bad = bytearray(f["x"].id.read_direct_chunk((0,))[1])
        if damage == "flip":
            bad[len(bad) // 2] ^= 0x01
        elif damage == "truncate":
            bad = bad[:-9]
        elif damage == "not a stream":
            bad = bytearray(x[:1000].tobytes())
        else:
            bad[4:6] = struct.pack("<H", 2)
        g = f.create_dataset("y", shape=x.shape, dtype=np.float32, chunks=(1000,), compression=FILTER_ID,
                             compression_opts=cd_values(0, "group", 128, True, 1e-3, 1e-3))
        g.id.write_direct_chunk((0,), bytes(bad), 0)
        with pytest.raises(OSError):
            g[:1000]
    assert "qstage HDF5 filter: decoding" in capfd.readouterr().err


def test_reading_ignores_cd_values(compressed):
    """A stream is self-describing: a dataset whose cd_values say otherwise still decodes it."""
    path, x = compressed
    with h5py.File(path, "a") as f:
        g = f.create_dataset("y", shape=(1000,), dtype=np.float32, chunks=(1000,), compression=FILTER_ID,
                             compression_opts=cd_values(0, "szx", 64, False, 0, 0))
        g.id.write_direct_chunk((0,), f["x"].id.read_direct_chunk((0,))[1], 0)
        assert np.array_equal(g[...], f["x"][:1000])


GOOD_OPTS = cd_values(0, "group", 128, True, 1e-3, 1e-3)
BAD_OPTS = {
    "8 cd_values": GOOD_OPTS[:8],
    "no cd_values": (),
    "layout version 2": (2,) + GOOD_OPTS[1:],
    "element type 2": cd_values(2, "group", 128, True, 1e-3, 1e-3),
    "complex64 on odd float32 chunks": cd_values(1, "group", 128, True, 1e-3, 1e-3),
    "pipeline 6": cd_values(0, 6, 128, True, 1e-3, 1e-3),
    "block 100": cd_values(0, "group", 100, True, 1e-3, 1e-3),
    "flags 2": GOOD_OPTS[:4] + (2,) + GOOD_OPTS[5:],
    "szx with a threshold": cd_values(0, "szx", 128, True, 1e-3, 1e-3),
    "negative error": cd_values(0, "group", 128, True, 1e-3, -1e-3),
    "nan threshold": cd_values(0, "group", 128, True, float("nan"), 1e-3),
}


@pytest.mark.parametrize("case", list(BAD_OPTS))
def test_bad_cd_values_never_write_garbage(tmp_path, case, capfd):
    x = spiky(np.random.default_rng(9), 999)
    opts = BAD_OPTS[case]
    # A mandatory filter (flags 0): the write fails. Without the chunk cache HDF5 filters the chunk
    # during the write and drops it on failure; a cached chunk that can never be flushed instead
    # fails every flush and close, and HDF5 1.10.8 then crashes in H5D_close at exit.
    with h5py.File(tmp_path / "m.h5", "w", rdcc_nbytes=0) as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((333,))
        dcpl.set_filter(FILTER_ID, 0, opts)
        dset = h5py.Dataset(h5py.h5d.create(f.id, b"x", h5py.h5t.NATIVE_FLOAT, h5py.h5s.create_simple(x.shape),
                                            dcpl=dcpl))
        with pytest.raises(OSError, match="filter returned failure"):
            dset[...] = x
    assert "qstage HDF5 filter: encoding" in capfd.readouterr().err
    # h5py's compression= makes the filter optional: HDF5 then stores the chunks unfiltered (filter
    # mask bit 0 set), so the data still reads back exactly.
    try:
        write(tmp_path / "o.h5", x, opts, (333,))
    except (OSError, ValueError):
        return
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert all(mask & 1 for mask, _ in chunk_streams(f["x"]))
        assert np.array_equal(f["x"][...].view(np.uint32), x.view(np.uint32))
