"""The results version: part of every cell hash.

Bump it in the same commit as any change to the grader (``specscale/grading``), the
metrics (``specscale/metrics``) or anything else that changes what a finished cell's
files would say for the same config and data: cells of the old version then no longer
count as done, and a rerun of the sweep recomputes them instead of mixing old and new.
"""
RESULTS_VERSION = 3
# 2: lazy verification reads Algorithm 3 as policy.lv_* say (B_max counts scoring inputs,
#    a sibling group flushes its own tasks, deferrals count decisions); engine.attention=auto
#    on the CPU is the torch path; summaries carry returned_path_tokens_mean.
