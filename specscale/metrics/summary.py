"""docs/design.md §5 metrics of one cell, from the recorder's rows."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
from statsmodels.stats.proportion import proportion_confint


def wilson_interval(successes: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    lo, hi = proportion_confint(successes, n, alpha=alpha, method="wilson")
    # The interval contains the estimate; floating error does not always keep it so (0 of 12
    # gives a lower bound of 2.8e-17), and error bars drawn from it must not be negative.
    p = successes / n
    return float(min(lo, p)), float(max(hi, p))


def summarize(rec: Any, budgets_s: Sequence[float], bytes_per_block: int, prm_bytes_per_block: int = 0) -> dict[str, Any]:
    req = pd.DataFrame(rec.requests)
    it = pd.DataFrame(rec.iterations)
    vb = pd.DataFrame(rec.verify_batches)
    makespan = rec.makespan_s
    n = len(req)
    logical = int(req["logical_tokens"].sum()) if n else 0
    output = int(req["output_tokens"].sum()) if n else 0
    gen = it[it["kind"] == "generate"] if len(it) else it
    physical = int(gen["physical_rows"].sum()) if len(gen) else 0
    draws = int(gen["logical_draws"].sum()) if len(gen) else 0
    gen_s = float(gen["seconds"].sum()) if len(gen) else 0.0
    ver_s = float(vb["seconds"].sum()) if len(vb) else 0.0
    graded = req["correct"].dropna() if n else pd.Series(dtype=bool)
    n_correct = int(graded.astype(bool).sum())
    lo, hi = wilson_interval(n_correct, len(graded))
    lat = req["latency_s"].to_numpy() if n else np.array([])
    per_tok = (req["latency_s"] / req["logical_tokens"].clip(lower=1)).to_numpy() if n else np.array([])
    per_out = (req["latency_s"] / req["output_tokens"].clip(lower=1)).to_numpy() if n else np.array([])
    # The same from admission: without the time a request queued for a concurrency slot.
    per_out_admit = (((req["finish_s"] - req["admit_s"]) / req["output_tokens"].clip(lower=1)).to_numpy()
                     if n else np.array([]))
    prm = rec.prm_stats
    rounds = pd.DataFrame(rec.rounds)
    out: dict[str, Any] = {
        "n_requests": n,
        "makespan_s": makespan,
        "logical_tokens": logical,
        "decoded_tokens": physical,
        "drawn_tokens": draws,
        "wasted_tokens": draws - logical,
        "output_tokens": output,
        # The mean length of a returned path: policies that close rounds early (the perfect-
        # score shortcut) can return shorter answers, so output_tok_s alone is not a time ratio.
        "returned_path_tokens_mean": output / n if n else float("nan"),
        # The paper's throughput: tokens of the responses returned, per second (docs/design.md §5).
        "output_tok_s": output / makespan if makespan > 0 else float("nan"),
        "logical_tok_s": logical / makespan if makespan > 0 else float("nan"),
        "throughput_tok_s": logical / makespan if makespan > 0 else float("nan"),  # = logical_tok_s (older name)
        "decoded_tok_s": physical / makespan if makespan > 0 else float("nan"),
        "norm_latency_ms_per_output_tok": float(per_out.mean() * 1e3) if n else float("nan"),
        "norm_latency_ms_per_tok": float(per_tok.mean() * 1e3) if n else float("nan"),
        "norm_latency_from_admit_ms_per_output_tok": float(per_out_admit.mean() * 1e3) if n else float("nan"),
        "latency_p50_s": float(np.percentile(lat, 50)) if n else float("nan"),
        "latency_p90_s": float(np.percentile(lat, 90)) if n else float("nan"),
        "latency_p99_s": float(np.percentile(lat, 99)) if n else float("nan"),
        "accuracy": n_correct / len(graded) if len(graded) else float("nan"),
        "accuracy_ci_low": lo,
        "accuracy_ci_high": hi,
        "accuracy_best_single": float(req["correct_best_single"].dropna().astype(bool).mean()) if n else float("nan"),
        "accuracy_majority": float(req["correct_majority"].dropna().astype(bool).mean()) if n else float("nan"),
        "time_generation_s": gen_s,
        "time_verification_s": ver_s,
        "time_idle_s": rec.idle_s,
        "time_other_s": max(0.0, makespan - gen_s - ver_s - rec.idle_s),
        "generation_iterations": len(gen),
        "prm_invocations": len(vb),
        "prm_batch_tasks_mean": float(vb["n_tasks"].mean()) if len(vb) else 0.0,
        "prm_batch_tokens_mean": float(vb["n_tokens"].mean()) if len(vb) else 0.0,
        "prm_tokens": int(vb["n_tokens"].sum()) if len(vb) else 0,
        "prm_cached_tokens": int(vb["n_cached_tokens"].sum()) if len(vb) else 0,
        "prm_tokens_per_logical_token": (float(vb["n_tokens"].sum()) / logical) if len(vb) and logical else float("nan"),
        "prm_cache_evictions": prm.evictions if prm is not None else 0,
        "prm_uncached_tasks": prm.uncached_tasks if prm is not None else 0,
        "prm_kv_peak_blocks": prm.peak_blocks if prm is not None else 0,
        "prm_kv_peak_bytes": (prm.peak_blocks if prm is not None else 0) * prm_bytes_per_block,
        "prm_kv_blocks_total": rec.prm_kv_blocks_total,
        "prm_kv_bytes_total": rec.prm_kv_blocks_total * prm_bytes_per_block,
        "cost_model_extrapolated": getattr(rec, "cost_model_extrapolated", None),
        **getattr(rec, "profile_speed", {}),
        "prm_triggers": {str(k): int(v) for k, v in vb["trigger"].value_counts().items()} if len(vb) else {},
        "physical_logical_ratio": physical / draws if draws else float("nan"),
        "kv_peak_blocks": rec.kv_peak_blocks,
        "kv_peak_bytes": rec.kv_peak_blocks * bytes_per_block,
        "kv_blocks_total": rec.kv_blocks_total,
        "kv_bytes_total": rec.kv_blocks_total * bytes_per_block,
        "prefix_hit_tokens": rec.prefix_hit_tokens,
        "recomputed_prefill_tokens": rec.recomputed_prefill_tokens,
        "preemptions": rec.preemptions,
        **occupancy(gen, rec.kv_blocks_total, rec.row_cap),
        "rounds": len(rounds),
        "shortcut_round_fraction": float((rounds["closed_by"] == "shortcut").mean()) if len(rounds) else 0.0,
        "losing_branch_lifetime_mean_s": float(np.mean(rec.cancel_lifetimes)) if rec.cancel_lifetimes else 0.0,
        "cancelled_candidates": len(rec.cancel_lifetimes),
    }
    for b in budgets_s:
        ok = req[(req["latency_s"] <= b) & req["correct"].fillna(False).astype(bool)] if n else req
        out[f"correct_per_s_at_budget_{_fmt(b)}s"] = len(ok) / makespan if makespan > 0 else float("nan")
    return out


def _fmt(b: float) -> str:
    return str(int(b)) if float(b).is_integer() else str(b)


def occupancy(gen: pd.DataFrame, kv_blocks_total: int, row_cap: int) -> dict[str, Any]:
    """How full the server ran: rows per generation iteration against the row cap, and
    KV in use against the pool, time-weighted over generation iterations (what waiting
    costs: a row that finds the cap reached, or KV that finds the pool full, waits)."""
    if not len(gen):
        return {"row_cap": row_cap, "rows_per_iteration_mean": float("nan"), "rows_per_iteration_max": 0,
                "row_cap_bound_share": float("nan"), "deferred_rows_mean": float("nan"),
                "kv_used_fraction_mean": float("nan")}
    w = gen["seconds"].to_numpy(dtype=float)
    w = w if w.sum() > 0 else np.ones(len(gen))
    rows = gen["rows"].to_numpy(dtype=float)
    kv = gen["kv_used_blocks"].to_numpy(dtype=float) / max(kv_blocks_total, 1)
    return {
        "row_cap": row_cap,
        "rows_per_iteration_mean": float(np.average(rows, weights=w)),
        "rows_per_iteration_max": int(rows.max()),
        "row_cap_bound_share": float(np.average(rows >= row_cap, weights=w)) if row_cap else float("nan"),
        "deferred_rows_mean": float(np.average(gen["deferred_rows"].to_numpy(dtype=float), weights=w)),
        "kv_used_fraction_mean": float(np.average(kv, weights=w)),
    }
