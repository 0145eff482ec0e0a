#!/usr/bin/env python3
"""Writes schemas/outputs/<stage>.json for the stages listed below: the layout of a stage's
output file as `qstage inspect --json` prints it (provenance attributes, the stage's own
attributes, and the datasets it always writes). Run it after changing a stage's layout:
    python3 scripts/make_output_schemas.py
"""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROVENANCE = {
    "qstage.stage": None, "qstage.stage_version": {"type": "integer", "minimum": 1},
    "qstage.step": {"type": "string"}, "qstage.workflow": {"type": "string"},
    "qstage.params": {"type": "string", "description": "canonical parameters (JSON), defaults filled in"},
    "qstage.inputs": {"type": "string", "description": "slot -> {source, content hash} (JSON)"},
    "qstage.step_key": {"type": "string"}, "qstage.version": {"type": "string"},
    "qstage.backend": {"enum": ["cpu", "cuda"]}, "qstage.device": {"type": "string"},
    "qstage.ranks": {"type": "integer", "minimum": 1},
    "qstage.wall_seconds": {"type": "number", "minimum": 0, "description": "summed over attempts"},
    "qstage.attempts": {"type": "integer", "minimum": 1},
    "qstage.peak_device_bytes": {"type": "integer", "minimum": 0},
    "qstage.peak_host_bytes": {"type": "integer", "minimum": 0},
    "qstage.created": {"type": "string"},
    "qstage.summary": {"type": "string", "description": "JSON summary of the planned work"},
}
STRING, INT, NUMBER = {"type": "string"}, {"type": "integer"}, {"type": "number"}
JSON_TEXT = {"type": "string", "description": "JSON"}

# stage -> (description, own attributes {name: schema}, datasets [(path, dtype, rank)]); an
# attribute whose name ends in "?" is written only sometimes.
STAGES = {
    "tn.build": ("a tensor network: its JSON description (UTF-8 bytes), one dataset per tensor in "
                 "/tensors, and the bitstrings of an amplitude network",
                 {"network_kind": {"enum": ["amplitude", "expectation", "generic"]},
                  "network_description": {"type": "string"},
                  "tensors": {"type": "integer"},
                  "problem?": {"type": "string", "description": "independent_sets, spin_glass, surface_code and detector_error_model sources: the instance (JSON): the graph's sites and edges (a spin glass's couplings J), or the decoding problem's detectors, observables, mechanisms, syndrome and a sampled error's true_observables (and a surface code's checks and logical support)"},
                  "simplification?": {"type": "string", "description": "with params.simplify: what it did (JSON): tensors_before, tensors_after, modes_before, modes_after, hyperindices (modes held by three tensors or more), fused, fixed, absorbed, split, seconds"}},
                 [("/network", "uint8", 1),
                  ("/tensors/t000000", "complex128",
                   {"minItems": 1, "description": "the tensor's extents (a circuit's first tensor is a qubit's |0>, "
                    "shape [2]; a generic network's may have any rank; rank 0 is stored as [1])"})]),
    "tn.path": ("a contraction path (SSA pairs) with its sliced modes and costs (seed 000's C_t in "
                "complex multiply-adds, C_s and C_m in elements)",
                {"cost": JSON_TEXT, "method": STRING, "C_t_multiply_adds": NUMBER, "C_s_elements": NUMBER,
                 "C_m_elements": NUMBER, "flops_total": NUMBER},
                [("/path", "int64", 2), ("/sliced", "int64", 1)]),
    "tn.plan": ("an executable contraction plan (JSON in /plan), its rates and predicted seconds (JSON in "
                "/prediction, a measurement where tn.plan measured the rates) and per-step columns for plotting",
                {"slices": INT, "arena_bytes": INT, "input_transposes": INT, "packed_steps": INT,
                 "step_transposes": INT, "transposed_bytes": INT, "spilled": INT, "host_arena_bytes": INT,
                 "host_copy_bytes": INT, "scratch": INT,
                 "predicted_seconds_per_slice": {"type": "number", "description": "the steps every slice runs"},
                 "predicted_prologue_seconds": {"type": "number", "description": "the invariant steps, once per "
                                                "bitstring"},
                 "predicted_seconds_total": {"type": "number", "description": "per bitstring: the prologue once, "
                                             "the slices' steps per slice"},
                 "invariant_steps": {"type": "integer", "description": "steps that run once per bitstring "
                                     "(reuse_invariant)"},
                 "invariant_flops": {"type": "number", "description": "their flops, once per bitstring"},
                 "flops_per_slice": {"type": "number", "description": "the flops every slice runs"},
                 "flops_per_slice_without_reuse": {"type": "number", "description": "every step's flops"},
                 "flops_total": {"type": "number", "description": "per bitstring: invariant flops once, "
                                 "flops_per_slice per slice"},
                 "flops_total_without_reuse": {"type": "number", "description": "per bitstring, every step in "
                                               "every slice"},
                 "persistent_bytes": {"type": "integer", "description": "device memory of the invariant "
                                      "results the slices read (resident, once beside the slots' arenas)"},
                 "prologue_arena_bytes": {"type": "integer", "description": "of arena_bytes, what the prologue "
                                          "uses"},
                 "bandwidth_bytes_per_second": NUMBER, "gemm_flops_per_second": NUMBER},
                [("/plan", "uint8", 1), ("/prediction", "uint8", 1), ("/steps/flops", "float64", 1),
                 ("/steps/live_bytes", "uint64", 1),
                 ("/steps/output_bytes", "uint64", 1), ("/steps/predicted_seconds", "float64", 1),
                 ("/steps/invariant", "uint8", 1)]),
    "tn.contract": ("amplitudes per bitstring (or the network's value) and the measured seconds "
                    "of each plan step",
                    {"slices": {"type": "integer"},
                     "compute": {"type": "string", "enum": ["full", "tf32", "3xtf32", "bf16"], "description": "the arithmetic of the compute-bound complex64 products (parameter compute; auto's choice)"},
                     "compute_requested?": {"type": "string", "description": "auto, when the mode was chosen by max_error"},
                     "max_error?": {"type": "number", "description": "the parameter max_error"},
                     "max_error_exceeded?": {"type": "integer", "description": "1 when the measured reference_relative_error exceeds max_error"},
                     "reduced_steps?": {"type": "string", "description": "JSON, in a reduced compute mode: steps (how many ran in it), flop_fraction (their share of the flops), staging_bytes (device memory per work item for the rounded operands), predicted_relative_error (the error model's estimate of the rounding's share)"},
                     "invariant_steps": {"type": "integer", "description": "the plan's steps that run once per bitstring (its prologue) rather than per slice"},
                     "prologue_runs": {"type": "integer", "description": "prologues run, summed over ranks: once per bitstring on each rank that contracts it (0 without invariant steps)"},
                     "reference_relative_error?": {"type": "number", "description": "the first result against a complex128 contraction without TF32 (reference_check)"},
                     "reference_slices?": {"type": "integer"},
                     "reference_seconds?": {"type": "number"},
                     "reference_note?": {"type": "string"}},
                    [("/step_seconds", "float64", 1)]),
    "tn.statevector": ("amplitudes per bitstring, or a Pauli string's expectation value, from a "
                       "state-vector simulation",
                       {"precision": {"enum": ["complex64", "complex128"]}},
                       []),
    "tensor.compare": ("a dataset against a reference: relative 2-norm error and largest difference",
                       {"count": INT},
                       [("/relative_error", "float64", 0), ("/max_abs_difference", "float64", 0),
                        ("/norm_a", "float64", 0), ("/norm_b", "float64", 0)]),
    "compress": ("a chunked dataset (named by the 'dataset' parameter, /data by default) whose chunks are "
                 "codec streams under HDF5 filter 32881; its attributes codec.* give the pipeline and the "
                 "absolute bounds",
                 {"compress.input_bytes": INT, "compress.stored_bytes": INT, "compress.ratio": NUMBER,
                  "compress.codec": JSON_TEXT},
                 [("/data", ["float32", "complex64"], None)]),
    "decompress": ("the decoded values (named by the 'dataset' parameter, /data by default)", {},
                   [("/data", ["float32", "complex64"], None)]),
    "compress.evaluate": ("ratio, errors, fidelity and throughput of codec settings on a dataset",
                          {"compress.codec": JSON_TEXT, "compress.max_abs_error": NUMBER},
                          [("/ratio", "float64", 0), ("/max_error", "float64", 0), ("/bound", "float64", 0),
                           ("/beyond_bound", "uint64", 0), ("/relative_error", "float64", 0),
                           ("/fidelity", "float64", 0), ("/compress_gbps", "float64", 0),
                           ("/decompress_gbps", "float64", 0), ("/stored_bytes", "uint64", 0)]),
    "sci.solve": ("selected CI: the final space (/dets, sorted (alpha, beta) occupation strings) and its coefficients, E_var, E_PT2 and their sum, and per iteration the energies and counts in /iterations; with an eps_var schedule, per threshold in /schedule (eps_var, e_var, e_pt2, dets, iteration); with a semistochastic PT2 (eps_pt2_large), /e_pt2_error and /pt2_stochastic (deterministic_e_pt2, batch_e_pt2, generated, unique); with nroots > 1, every root's in /roots (energy, e_pt2, e_total, s_squared, coefficients (roots, n), e_pt2_error, e_extrapolated) and /iterations/e_var_roots, e_pt2_roots (the scalars stay the lowest root's)",
                  {"converged": {"type": "integer", "enum": [0, 1]},
                   "stop_reason": {"type": "string"},
                   "reference_energy?": {"type": "number"},
                   "e_extrapolated?": {"type": "number", "description": "with an eps_var schedule of two or more thresholds with a PT2: E_var extrapolated linearly against E_PT2 to E_PT2 = 0 (Ha), over /schedule"},
                   "pt2_samples?": {"type": "integer", "minimum": 2, "description": "semistochastic PT2: draws a batch"},
                   "pt2_seed?": {"type": "integer", "minimum": 0, "description": "semistochastic PT2: the seed of its draws"},
                   "eps_pt2_large?": {"type": "number", "description": "semistochastic PT2: its deterministic part's threshold"},
                   "pt2_target_met?": {"type": "integer", "enum": [0, 1], "description": "semistochastic PT2: 1 when its error bar (/e_pt2_error) fell below pt2_target_error, 0 when pt2_batches ran out first"},
                   "extrapolation_slope?": {"type": "number", "description": "that line's slope, dE_var / dE_PT2"},
                   "extrapolation_points?": {"type": "integer", "minimum": 2, "description": "the thresholds the line was fitted to"},
                   "irrep": {"type": "integer", "minimum": 1, "maximum": 8, "description": "the irrep of the state (the FCIDUMP's labels, Molpro's 1-8)"},
                   "irrep_from": {"enum": ["ISYM", "parameter irrep", "occupation"], "description": "what chose the irrep"},
                   "ms2": {"type": "integer", "description": "2 S_z of the state"},
                   "s_squared": {"type": "number", "description": "<S^2> of the final variational state"},
                   "reference_determinant": {"type": "string", "description": "the determinant the space grew from: its occupied orbitals (0-based) of each spin"},
                   "reference_diagonal": {"type": "number", "description": "its diagonal energy <D|H|D> (Ha)"},
                   "nroots?": {"type": "integer", "minimum": 2, "description": "present when several roots were asked for: nroots (the roots found are /roots/energy's length)"},
                   "leading_determinants": {"type": "string", "description": "the final state's five largest coefficients and their determinants, one a line"},
                   "warning?": {"type": "string", "description": "present when a determinant of another irrep has a lower diagonal than the reference: the lowest state may be of another irrep"},
                   "peak_device_bytes?": {"type": "array", "description": "per iteration, the peak device memory (bytes, the largest over ranks)", "items": {"type": "integer", "minimum": 0}},
                   "peak_host_bytes?": {"type": "array", "description": "per iteration, the peak pinned host memory (bytes, the largest over ranks)", "items": {"type": "integer", "minimum": 0}}},
                  [("/energy", "float64", 0), ("/e_pt2", "float64", 0), ("/e_total", "float64", 0),
                   ("/dets", "uint64", 2), ("/coefficients", "float64", 1), ("/joined_iteration", "int32", 1),
                   ("/iterations/e_var", "float64", 1), ("/iterations/e_pt2", "float64", 1),
                   ("/iterations/dets", "uint64", 1), ("/iterations/generated", "uint64", 1),
                   ("/iterations/unique", "uint64", 1), ("/iterations/selected", "uint64", 1),
                   ("/iterations/davidson_products", "uint64", 1), ("/pt2_generated", "uint64", 0),
                   ("/pt2_unique", "uint64", 0)]),
    "sci.nnqs": ("the network's variational energy on the final space (/energy), the space (/dets, sorted "
                 "(alpha, beta) occupation strings) and psi over it (/amplitudes, normalized), every AdamW step's "
                 "energy (/steps/energy), per iteration the space, energy, variance, the lowest energy on the space, "
                 "candidates and the time split in /iterations, and the trained parameters by name in /network",
                 {"converged": {"type": "integer", "enum": [0, 1],
                                "description": "0: stopped at max_iterations with E still moving by energy_tolerance "
                                               "or more an iteration"},
                  "stop_reason": {"enum": ["max_iterations", "energy_tolerance", "max_dets", "no candidate left"]},
                  "irrep": {"type": "integer", "minimum": 1, "maximum": 8}, "ms2": INT,
                  "parameters": {"type": "integer", "minimum": 1, "description": "the network's parameters"},
                  "network_device": {"type": "string",
                                     "description": "where the network ran, and its LibTorch: \"cuda:0 (LibTorch 2.11.0)\""},
                  "network_peak_device_bytes?": {"type": "integer", "minimum": 0,
                                                 "description": "on a GPU: the most device memory LibTorch's allocator "
                                                                "held, within the network's share of the device budget"},
                  "reference_energy?": NUMBER},
                 [("/energy", "float64", 0), ("/dets", "uint64", 2), ("/amplitudes", "complex128", 1),
                  ("/steps/energy", "float64", 1)]
                 + [(f"/iterations/{name}", dtype, 1)
                    for name, dtype in [("dets", "uint64"), ("energy", "float64"), ("variance", "float64"),
                                        ("ci_energy", "float64"), ("coupled_energy", "float64"), ("infidelity", "float64"),
                                        ("modulus_infidelity", "float64"), ("fit_steps", "uint64"),
                                        ("generated", "uint64"), ("unique", "uint64"),
                                        ("selected", "uint64"), ("seconds_generate", "float64"),
                                        ("seconds_dedup", "float64"), ("seconds_inference", "float64"),
                                        ("seconds_optimize", "float64")]]),
    "sci.integrals": ("molecular integrals from an FCIDUMP file: h1 (norb x norb), the two-electron "
                      "integrals 8-fold packed (their attribute 'layout'), the core energy, the header's NORB, "
                      "NELEC, MS2, ISYM and ORBSYM, orbital energies (NaN where absent), line counts, and the excitation "
                      "tables of heat-bath CI in /excitations (padded lists, their width an attribute)",
                      {},
                      [("/h1", "float64", 2), ("/eri", "float64", 1), ("/core_energy", "float64", 0),
                       ("/orbsym", "int32", 1), ("/orbital_energies", "float64", 1), ("/norb", "int64", 0),
                       ("/nelec", "int64", 0), ("/ms2", "int64", 0), ("/isym", "int64", 0),
                       ("/integral_lines", "uint64", 0), ("/repeated_lines", "uint64", 0),
                       ("/excitations/coulomb", "float64", 2), ("/excitations/exchange", "float64", 2)]
                      + [(f"/excitations/{kind}_{what}", dtype, rank)
                         for kind, value in [("single", "bound"), ("opposite", "value"), ("same", "value")]
                         for what, dtype, rank in [("length", "int32", 1),
                                                   ("target", "uint8" if kind == "single" else "int32", 2),
                                                   (value, "float64", 2)]]),
}


# The result of tn.contract and tn.statevector: amplitudes (one row per bitstring, with their
# bitstrings) or the value of a closed network.
def dataset(path, dtype, rank):
    """dtype: one type, or a list of the types it may have; rank None: any; a dict: the shape's schema."""
    shape = (rank if isinstance(rank, dict) else {"type": "array"} if rank is None else {"maxItems": 0} if rank == 0
             else {"minItems": rank, "maxItems": rank})
    types = {"enum": dtype} if isinstance(dtype, list) else {"const": dtype}
    return {"contains": {"type": "object", "required": ["path", "dtype", "shape"],
                         "properties": {"path": {"const": path}, "dtype": types, "shape": shape}}}


def result():
    types = ["complex64", "complex128"]  # tn.statevector's precision: complex64
    return {"anyOf": [{"allOf": [dataset("/amplitudes", types, None), dataset("/bitstrings", "uint8", 2)]},
                      dataset("/value", types, None)]}


def schema(stage, description, attributes, datasets):
    props = {k: (v if v is not None else {"const": stage}) for k, v in PROVENANCE.items()}
    props.update({k.rstrip("?"): v for k, v in attributes.items()})
    required = [k for k in props if k + "?" not in attributes]
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": f"{stage} output",
        "description": f"the layout of a {stage} output file, as `qstage inspect --json` prints it: {description}",
        "type": "object",
        "required": ["file", "attributes", "datasets"],
        "properties": {
            "file": {"type": "string"},
            "attributes": {"type": "object", "required": required, "properties": props},
            "datasets": {"type": "array", "minItems": max(1, len(datasets)),
                         "allOf": [dataset(*d) for d in datasets] + ([result()] if stage in RESULT_STAGES else [])},
        },
    }


RESULT_STAGES = {"tn.contract", "tn.statevector"}


def main():
    for stage, (description, attributes, datasets) in STAGES.items():
        path = ROOT / "schemas" / "outputs" / f"{stage}.json"
        path.write_text(json.dumps(schema(stage, description, attributes, datasets), indent=2) + "\n")
        print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
