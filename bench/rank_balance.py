"""The balance of a per-rank load (seed 004's Table 1): max/min and the coefficient of variation,
shared by the benches that report it (sci_ranks_bench.py, dedup_bench.py)."""
import statistics


def balance(load):
    load = [int(x) for x in load]
    mean = statistics.fmean(load)
    return {"records_per_rank": load, "max_over_min": max(load) / min(load) if min(load) else None,
            "cv": statistics.pstdev(load) / mean if mean else None}
