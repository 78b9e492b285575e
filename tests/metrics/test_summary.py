"""Summary readings that need more than one cell's worth of context to mean something."""
from __future__ import annotations

import pytest


def test_latency_from_admission_leaves_out_the_queue_for_a_slot():
    from cfg_helpers import compose_cfg
    from specscale.cell import build_server
    from specscale.metrics.summary import summarize

    queued = summarize(build_server(compose_cfg("policy=nonspec", "beam=4", "concurrency=1")).run(), [60], 1)
    assert queued["norm_latency_from_admit_ms_per_output_tok"] < 0.7 * queued["norm_latency_ms_per_output_tok"]
    free = summarize(build_server(compose_cfg("policy=nonspec", "beam=4", "concurrency=4")).run(), [60], 1)
    assert free["norm_latency_from_admit_ms_per_output_tok"] == pytest.approx(free["norm_latency_ms_per_output_tok"])
