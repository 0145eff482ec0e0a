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
                  "network_description": STRING, "tensors": INT},
                 [("/network", "uint8", 1), ("/tensors/t000000", "complex128", 1)]),
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
                    {"slices": INT, "tf32": INT,
                     "invariant_steps": {"type": "integer", "description": "the plan's steps that run once per "
                                         "bitstring (its prologue) rather than per slice"},
                     "prologue_runs": {"type": "integer", "description": "prologues run, summed over ranks: once "
                                       "per bitstring on each rank that contracts it (0 without invariant steps)"},
                     "reference_relative_error?": {"type": "number", "description": "the first result against "
                                                   "a complex128 contraction without TF32 (reference_check)"},
                     "reference_slices?": INT, "reference_seconds?": NUMBER, "reference_note?": STRING},
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
    "sci.solve": ("selected CI: the final space (/dets, sorted (alpha, beta) occupation strings) and "
                  "its coefficients, E_var, E_PT2 and their sum, and per iteration the energies and counts "
                  "in /iterations",
                  {"converged": {"type": "integer", "enum": [0, 1]}, "stop_reason": STRING,
                   "reference_energy?": NUMBER},
                  [("/energy", "float64", 0), ("/e_pt2", "float64", 0), ("/e_total", "float64", 0),
                   ("/dets", "uint64", 2), ("/coefficients", "float64", 1), ("/joined_iteration", "int32", 1),
                   ("/iterations/e_var", "float64", 1), ("/iterations/e_pt2", "float64", 1),
                   ("/iterations/dets", "uint64", 1), ("/iterations/generated", "uint64", 1),
                   ("/iterations/unique", "uint64", 1), ("/iterations/selected", "uint64", 1),
                   ("/iterations/davidson_products", "uint64", 1)]),
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
    """dtype: one type, or a list of the types it may have; rank None: any."""
    shape = {"type": "array"} if rank is None else {"maxItems": 0} if rank == 0 else {"minItems": rank, "maxItems": rank}
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
