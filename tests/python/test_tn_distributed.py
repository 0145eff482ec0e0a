"""Distributed contraction (issue 20, seed 000 section IV-B): tn.plan with ranks: P plans the
large steps sharded over P ranks; tn.contract under `mpirun -np P` runs that plan with every rank
holding its shard, redistributing by all-to-all and gathering at the end of each use-chain (on a
multiple of P ranks, groups of P share the slices). The result equals the one-rank contraction (1e-12 relative in complex128, 1e-6 in complex64), is
the same run to run, resumes after a stop, and a plan for P ranks is refused on another count."""
import hashlib
import json
import re

import h5py
import numpy as np
import pytest

from conftest import DEVICE, ROOT, committed_run, one_line_error, run, sigterm_mpi_run, write_spec
from oracle import network_einsum

CIRCUIT = "random: {rows: 4, cols: 5, cycles: 10, seed: 3}"
BITS = "random_bitstrings: {count: 2, seed: 1}"
# The circuit's path, imported: these tests check the distribution planned on it (chains
# activated, kept, redistributed and gathered), which another path search's path may not need.
CIRCUIT_PATH = ROOT / "tests" / "data" / "paths" / "random_4x5x10_seed3.ssa.json"


def spec_text(source, precision, ranks, budget="64KiB", large="8KiB", options=""):
    plan = f"precision: {precision}, budget: {budget}, bandwidth: 1.0e10, gemm_rate: 1.0e11"
    if ranks > 1:
        plan += f", ranks: {ranks}, large_bytes: {large}"
    result = "amps" if "random:" in source else "value"
    path = (f"import: {CIRCUIT_PATH}, format: ssa" if source.startswith(CIRCUIT)
            else "max_seconds: 600, max_tries: 64, seed: 0")
    return f"""name: dist
{options}steps:
  - id: net
    stage: tn.build
    params: {{{source}}}
  - id: path
    stage: tn.path
    inputs: {{network: net}}
    params: {{{path}}}
  - id: plan
    stage: tn.plan
    inputs: {{network: net, path: path}}
    params: {{{plan}}}
  - id: {result}
    stage: tn.contract
    inputs: {{network: net, plan: plan}}
"""


def distributed_run(tmp, text, ranks):
    tmp.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp / "spec.yaml", text)
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE], mpi=ranks, timeout=600,
            env={"OMP_NUM_THREADS": "1"})
    assert r.code == 0, r
    return tmp / "run"


def result_of(run_dir, name):
    step = "amps" if name == "amplitudes" else name
    with h5py.File(run_dir / "outputs" / f"{step}.h5") as f:
        return f[name][()], dict(f.attrs)


def plan_of(run_dir, dataset="plan"):
    with h5py.File(run_dir / "outputs" / "plan.h5") as f:
        return json.loads(bytes(f[dataset][()]).decode())


@pytest.mark.parametrize("precision,tol", [("complex128", 1e-12), ("complex64", 1e-6)])
@pytest.mark.parametrize("ranks", [2, 3])
def test_distributed_amplitudes_equal_one_rank(tmp, ranks, precision, tol):
    """A 20-qubit random circuit's amplitudes with 8 KiB large steps: chains activated, kept,
    redistributed (forced ones at P = 3) and gathered; at P = 3 the distributed modes' 4 combos lie
    unevenly over the ranks (one rank holds two, so resharding runs two rounds)."""
    source = f"{CIRCUIT}, {BITS}"
    _, one = committed_run(tmp / "one", spec_text(source, precision, 1))
    many = distributed_run(tmp / "many", spec_text(source, precision, ranks), ranks)
    plan = plan_of(many)
    d = plan["distribution"]
    transitions = [s["transition"] for s in d["steps"]]
    assert d["ranks"] == ranks and "activate" in transitions and "redistribute" in transitions, transitions
    want, _ = result_of(one, "amplitudes")
    got, attrs = result_of(many, "amplitudes")
    assert attrs["distributed_ranks"] == ranks and attrs["qstage.ranks"] == ranks
    assert np.linalg.norm(got - want) <= tol * np.linalg.norm(want), (got, want)
    with h5py.File(many / "outputs" / "amps.h5") as f:
        steps = len(d["steps"])
        for name in ("step_compute_seconds", "step_comm_seconds", "step_sent_bytes"):
            assert f[name].shape == (steps,)
            # the timings are measurements (out of the step's content identity); the bytes are not
            assert (f[name].attrs.get("qstage.measured") == 1) == name.endswith("_seconds"), name
        sent = f["step_sent_bytes"][()]
        # every redistribution and gather sends; local steps send nothing. (The timed item is the
        # run's second: slice-invariant steps ran once before it and sent nothing in it.)
        invariant = [st.get("invariant", False) for st in d["plan"]["steps"]]
        ends = {c[-1] for c in d["chains"]}
        for s, t in enumerate(transitions):
            sends = (t == "redistribute" or s in ends) and not invariant[s]
            assert (sent[s] > 0) == sends, (s, t, invariant[s], sent[s])
        assert f["sent_bytes_per_rank"].shape == (ranks,)


def test_generic_network_with_open_modes_distributed_over_two_ranks(tmp):
    """A generic network whose result keeps open modes (a value of 2 x 64 x 64): its last chain
    is gathered into the output, compared with numpy.einsum."""
    source = 'einsum: {expression: "abij,bcjk,cdkl,dail->ijl", sizes: {a: 16, b: 16, c: 16, d: 16, i: 2, j: 4, k: 4, l: 64}, seed: 5}'
    many = distributed_run(tmp / "many", spec_text(source, "complex128", 2, budget="16MiB", large="32KiB"), 2)
    d = plan_of(many)["distribution"]
    assert d["chains"], "32 KiB large steps make use-chains"
    want = network_einsum(many / "outputs" / "net.h5")
    got, _ = result_of(many, "value")
    assert np.linalg.norm(got.reshape(-1) - want) <= 1e-12 * np.linalg.norm(want)


OUT_OF_CORE = 'einsum: {expression: "ab,cd,ae,bd,ce->", sizes: {a: 16, b: 16, c: 16, d: 16, e: 16}, seed: 5}'


def out_of_core_spec(tmp, ranks):
    """The path that makes two 1 MiB intermediates from 4 KiB inputs (ab cd -> abcd, then with ae
    -> bcde, with bd -> ce, with ce), planned for `ranks` out of core at 128 KiB a rank: slots of
    at most 16 KiB, so abcd is sharded over two modes (256 combos), one of which the step after
    next contracts (a forced redistribution)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "path.json").write_text("[[0, 1], [0, 3], [0, 2], [0, 1]]")
    text = spec_text(OUT_OF_CORE, "complex128", ranks, budget="128KiB", large="32KiB")
    text = text.replace("params: {max_seconds: 600, max_tries: 64, seed: 0}", f"params: {{import: {tmp / 'path.json'}}}")
    text = text.replace("gemm_rate: 1.0e11", "gemm_rate: 1.0e11, reconfigure: false, out_of_core: true, "
                        "host_budget: 64MiB, pcie_bandwidth: 1.0e10")
    return write_spec(tmp / "spec.yaml", text)


@pytest.mark.parametrize("ranks", [2, 3])
def test_out_of_core_shards_stream_through_the_device_a_slot_at_a_time(tmp, ranks):
    """Out of core per rank (issue 20): with tn.plan's out_of_core the plan for P ranks limits a
    slot to an eighth of a rank's budget, so a large tensor is sharded over more combos than ranks.
    Under a device budget that cannot hold a rank's shards (the in-core run's peak less two shards
    of 512 KiB at P = 2), the shards live in host memory and pass through the device a slot at a
    time, through the steps and the forced redistribution: the same bits as the same plan with its
    shards on the device, the value numpy.einsum gives, and a device peak a shard below the other's."""
    spec = out_of_core_spec(tmp, ranks)
    shard = (1 << 20) // ranks
    runs = {}
    for name in ("in_core", "spilled"):
        budget = []
        if name == "spilled":  # the in-core peak less the two shards live while resharding (on cuda it holds cuBLAS's workspace too)
            with h5py.File(runs["in_core"] / "outputs" / "value.h5") as f:
                budget = ["--device-memory", f"{int(f.attrs['qstage.peak_device_bytes']) - 2 * shard + (64 << 10)}B"]
        r = run(["run", spec, "--run-dir", tmp / name, "--device", DEVICE] + budget, mpi=ranks, timeout=600,
                env={"OMP_NUM_THREADS": "1"})
        assert r.code == 0, r
        runs[name] = tmp / name
    d = plan_of(runs["spilled"])["distribution"]
    assert d["slot_bytes"] == 16 << 10 and d["slices"] == 1
    steps = d["steps"]
    assert [s["transition"] for s in steps] == ["activate", "redistribute", "gather", "local"], steps
    assert steps[1]["forced"] and len(steps[0]["distributed_modes"]) == 2, steps
    with h5py.File(runs["spilled"] / "outputs" / "value.h5") as f:
        on_host, got, attrs = f["step_shard_on_host"][()], f["value"][()], dict(f.attrs)
    with h5py.File(runs["in_core"] / "outputs" / "value.h5") as f:
        on_device, want, in_core_attrs = f["step_shard_on_host"][()], f["value"][()], dict(f.attrs)
    assert list(on_host) == [1, 1, 0, 0] and not on_device.any(), (on_host, on_device)
    assert got.tobytes() == want.tobytes()
    exact = network_einsum(runs["spilled"] / "outputs" / "net.h5")
    assert np.linalg.norm(got.reshape(-1) - exact) <= 1e-12 * np.linalg.norm(exact)
    assert attrs["qstage.peak_device_bytes"] + shard < in_core_attrs["qstage.peak_device_bytes"], (attrs, in_core_attrs)
    assert attrs["qstage.peak_host_bytes"] >= shard


def test_a_rank_out_of_its_budget_alone_ends_the_job_instead_of_hanging(tmp):
    """An out-of-core plan for a 4 x 4 lattice (4 Trotter steps) at 128 KiB a rank, run with
    128 KiB: rank 0 runs out in an all-to-all round the other rank reaches later. Thrown, its error
    unwound into a collective close of the MPI-IO files while the other rank waited in the
    all-to-all (the job hung); now the rank aborts the job at once: exit 2 and its one line."""
    source = "lattice: {rows: 4, cols: 4, steps: 4, seed: 1, disorder: 0.3}, random_bitstrings: {count: 1, seed: 1}"
    text = spec_text(source, "complex64", 2, budget="128KiB", large="8KiB").replace(
        "max_tries: 64", "max_tries: 16").replace("gemm_rate: 1.0e11", "gemm_rate: 1.0e11, out_of_core: true, "
                                                   "host_budget: 64MiB, pcie_bandwidth: 1.0e10")
    tmp.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp / "spec.yaml", text)
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE, "--device-memory", "128KiB"], mpi=2, timeout=120)
    assert r.code == 2, r
    errors = [l for l in r.err.splitlines() if l.startswith("qstage: error: ")]
    assert errors and all("device memory budget" in l and "expected a larger --device-memory" in l for l in errors), r


def digest(run_dir, name):
    return hashlib.sha256(result_of(run_dir, name)[0].tobytes()).hexdigest()


def test_distributed_runs_are_reproducible_and_resume_after_a_stop(tmp):
    """Two clean 2-rank runs give the same bits; a run stopped by SIGTERM on every rank (what srun
    does on preemption) exits 75 after a committed slice and `qstage resume` completes it with
    those bits again."""
    source = f"{CIRCUIT}, {BITS}"
    text = spec_text(source, "complex128", 2, options="options: {checkpoint_interval: 0}\n")
    a = distributed_run(tmp / "a", text, 2)
    b = distributed_run(tmp / "b", text, 2)
    assert digest(a, "amplitudes") == digest(b, "amplitudes")
    spec = write_spec(tmp / "s.yaml", text)
    run_dir = tmp / "run"
    state = run_dir / "steps" / "amps" / "run-state.bin"
    code, err = sigterm_mpi_run(2, ["run", spec, "--run-dir", run_dir, "--device", DEVICE], state)
    if code == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert code == 75, err
    m = re.search(r"stopped by SIGTERM in step 'amps' after (\d+) of (\d+) slices \(committed\)", err)
    assert m, err
    total = plan_of(run_dir)["distribution"]["slices"] * 2  # (two bitstrings)
    assert 1 <= int(m.group(1)) < total == int(m.group(2))
    r = run(["resume", run_dir, "--device", DEVICE], mpi=2, timeout=600, env={"OMP_NUM_THREADS": "1"})
    assert r.code == 0, r
    assert digest(run_dir, "amplitudes") == digest(a, "amplitudes")


def test_groups_of_ranks_share_the_slices_of_a_distributed_plan(tmp):
    """A plan for 2 ranks on 4: two groups of 2, each contracting every other slice distributed
    over its 2 ranks; the groups' sums added in group order equal the one-rank result."""
    source = f"{CIRCUIT}, {BITS}"
    _, one = committed_run(tmp / "one", spec_text(source, "complex128", 1))
    four = distributed_run(tmp / "four", spec_text(source, "complex128", 2), 4)
    want, _ = result_of(one, "amplitudes")
    got, attrs = result_of(four, "amplitudes")
    assert attrs["distributed_ranks"] == 2 and attrs["distributed_groups"] == 2 and attrs["qstage.ranks"] == 4
    assert np.linalg.norm(got - want) <= 1e-12 * np.linalg.norm(want)


def test_without_large_bytes_the_cost_model_picks_the_threshold(tmp):
    """tn.plan without large_bytes plans the distribution for a quarter of the budget and every 4x
    below it down to 64 KiB, and keeps the one projected fastest (the plan's prediction lists them)."""
    source = f"{CIRCUIT}, {BITS}"
    text = spec_text(source, "complex64", 2, budget="4MiB").replace(", large_bytes: 8KiB", "")
    _, run_dir = committed_run(tmp, text)
    d = plan_of(run_dir)["distribution"]
    projected = plan_of(run_dir, "prediction")["distribution"]
    tried = projected["large_bytes_tried"]
    assert [t["large_bytes"] for t in tried] == [1 << 20, 1 << 18, 1 << 16]
    best = min(tried, key=lambda t: t["predicted_seconds_total"])
    assert d["large_bytes"] == best["large_bytes"]
    assert abs(projected["predicted_seconds_total"] - best["predicted_seconds_total"]) <= 1e-12 * best["predicted_seconds_total"]


def test_a_rank_out_of_its_device_budget_ends_the_job_with_exit_2(tmp):
    """A device budget too small for a rank's shards: that rank cannot tell the others, which wait
    in an all-to-all, so the job ends (MPI_Abort) with exit 2 and the rank's one-line error."""
    source = f"{CIRCUIT}, {BITS}"
    tmp.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp / "spec.yaml", spec_text(source, "complex64", 2))
    r = run(["run", spec, "--run-dir", tmp / "run", "--device", DEVICE, "--device-memory", "64KiB"], mpi=2, timeout=300)
    assert r.code == 2, r
    errors = [l for l in r.err.splitlines() if l.startswith("qstage: error: ")]
    assert errors and all("device memory budget" in l and "expected a larger --device-memory" in l for l in errors), r


def test_a_plan_for_two_ranks_is_refused_on_three(tmp):
    """The plan file records P; a rank count that is not a multiple of it is a one-line error,
    exit 2. On one rank the plan file's one-rank plan runs."""
    source = f"{CIRCUIT}, {BITS}"
    tmp.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp / "spec.yaml", spec_text(source, "complex64", 2))
    r = run(["run", spec, "--run-dir", tmp / "three", "--device", DEVICE], mpi=3, timeout=600)
    one_line_error(r, "step 'amps' (tn.contract)", "made for 2 ranks", "expected mpirun -np 2 (or a multiple")
    _, one = committed_run(tmp / "one", spec_text(source, "complex64", 2))
    _, attrs = result_of(one, "amplitudes")
    assert "distributed_ranks" not in attrs and attrs["qstage.ranks"] == 1
