"""The mechanism-ablation section: ratios per ablation, paired by seed, and their change
from the unablated sim."""
from __future__ import annotations

import math

from analysis import cells as C
from analysis import fig_mechanism_ablation as M
from analysis.loader import load_index


def test_each_ablation_gets_its_ratios_and_their_change(tmp_path, small_cell):
    for abl in ("none", "independent_errors"):
        for pol in ("nonspec", "full"):
            small_cell(tmp_path / abl / pol, f"ablation={abl}", f"policy={pol}", "beam=4", "seed=1")
        for b_max in (256, 4096):
            small_cell(tmp_path / abl / f"full-{b_max}", f"ablation={abl}", "policy=full", "beam=4", "seed=1",
                       f"policy.b_max={b_max}")
        small_cell(tmp_path / abl / "ep_cd", f"ablation={abl}", "policy=ep_cd", "beam=4", "seed=1")
    cells = C.prepare(load_index(tmp_path))
    ratios = M.ratio_table(cells).set_index("ablation")
    assert set(ratios.index) == {"none", "independent_errors"}
    assert ratios.loc["none", "change full/nonspec"] == 0.0
    assert ratios.loc["independent_errors", "change full/nonspec"] == ratios.loc[
        "independent_errors", "full/nonspec"] - ratios.loc["none", "full/nonspec"]
    assert math.isnan(ratios.loc["none", "ep_cd/ep"])  # no ep cells: the ratio is missing, not made up
    # The makespan reading beside it: nonspec's makespan over full's, same problems and seed.
    none = cells[cells["ablation"] == "none"]
    nonspec = none[none["policy"] == "nonspec"].iloc[0]
    full = none[(none["policy"] == "full") & (none["policy_b_max"] == 2048)].iloc[0]
    want = nonspec["makespan_s"] / full["makespan_s"]
    assert math.isclose(ratios.loc["none", "full/nonspec makespan"], want, rel_tol=1e-12)
    curve = M.fig16_table(cells)
    assert set(curve["b_max"]) == {256, 2048, 4096} and set(curve["ablation"]) == {"none", "independent_errors"}
    sec = M.build(cells, tmp_path / "out")
    assert sec.figures and not sec.missing
