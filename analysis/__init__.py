"""Analysis of SpecScale result files: tables, figures and statistics.

Reads result files only (summary.json, the per-cell parquet tables, index.parquet).
One concept per module:

- `loader`      results directory -> one row per cell (index.parquet or a scan), cell tables
- `cells`       contexts, policy variants, seeds, pairing with a baseline
- `stats`       Wilson, t-interval, McNemar, paired bootstrap, latency percentiles, goodput
- `paired`      per-problem outcomes of two policies on the same problems and seeds
- `paper`       the paper's reported numbers (results/paper/specscale_reported.csv)
- `fig_*`, `table_*`  one figure family each: table(...) -> DataFrame, plot(...) -> Figure,
                build(...) -> Section (files written, notes, what could not be drawn)
- `report`      `python -m analysis.report <results dir> [--out DIR] [--budgets 30,60]`
"""
