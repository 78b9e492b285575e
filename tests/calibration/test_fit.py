"""The fitter recovers constants the sim itself generated targets from, and names what it
cannot reach."""
from __future__ import annotations

import pytest

from specscale.calibration.evaluate import Evaluator
from specscale.calibration.fit import UnreachableTarget, fit
from specscale.calibration.params import FitParam, overrides_for
from specscale.calibration.targets import Target, cell, metric

CELL = cell("nonspec", 4)
PARAMS = (FitParam("cost.gen_iteration_overhead_s", 2e-4, 0.05), FitParam("cost.prm_batch_overhead_s", 5e-4, 0.1))
TRUE = [0.006, 0.02]


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(n_problems=6, jobs=1, base=("concurrency=6",)) as ev:
        yield ev


def targets_from(ev, values):
    """Targets whose values are the sim's own predictions under `values` (1% tolerance)."""
    made = [Target("generation s", (CELL,), metric(CELL, "time_generation_s"), 1.0, tol=0.01),
            Target("verification s", (CELL,), metric(CELL, "time_verification_s"), 1.0, tol=0.01)]
    preds = ev.predict(made, overrides_for(PARAMS, values))
    return [Target(t.name, t.cells, t.measure, p, tol=0.01) for t, p in zip(made, preds)]


def test_recovers_known_constants(evaluator):
    targets = targets_from(evaluator, TRUE)
    res = fit(PARAMS, targets, lambda v: evaluator.predict(targets, overrides_for(PARAMS, v)), [0.002, 0.006],
              max_evals=30)
    for got, want in zip(res.values, TRUE):
        assert got == pytest.approx(want, rel=0.05)
    assert not res.missed
    res.check()  # nothing to raise


def test_an_unreachable_target_fails_clearly(evaluator):
    impossible = [Target("output tok/s", (CELL,), metric(CELL, "output_tok_s"), 1e7)]
    res = fit(PARAMS, impossible, lambda v: evaluator.predict(impossible, overrides_for(PARAMS, v)), TRUE,
              max_evals=4)
    assert res.missed
    with pytest.raises(UnreachableTarget, match=r"output tok/s \(paper 1e\+07.*at a bound: .*overhead_s"):
        res.check()


def test_more_than_eight_constants_is_refused():
    many = [FitParam(f"cost.x{i}", 1.0, 2.0) for i in range(9)]
    with pytest.raises(ValueError, match="at most 8"):
        fit(many, [], lambda v: [], [1.5] * 9)


def test_a_fit_reports_whether_it_converged():
    """scipy's status: > 0 when a convergence test held, 0 when the evaluation limit stopped it."""
    target = [Target("x", (), lambda s: 0.0, 0.01, tol=0.01)]
    predict = lambda v: [v[0] + v[1]]  # noqa: E731 (cheap: no sim)
    done = fit(PARAMS, target, predict, [0.002, 0.006], max_evals=60)
    assert done.converged and done.status > 0 and done.as_dict()["converged"] is True
    cut = fit(PARAMS, target, predict, [0.002, 0.006], max_evals=1)
    assert cut.status == 0 and not cut.converged and cut.as_dict()["status"] == 0


def test_a_model_pairs_constant_moves_only_its_cells_and_is_written_into_its_config():
    from specscale.calibration.__main__ import write_model_workload
    from specscale.calibration.params import SIM_PARAMS, scoped
    from specscale.calibration.targets import cell

    p3b = next(p for p in SIM_PARAMS if p.model == "qwen2.5-3b")
    (o,) = overrides_for([p3b], [55.0])
    assert scoped([o, "engine.cost.mfu=0.5"], cell("nonspec", 8, model="qwen2.5-3b").overrides) == [
        "++model.sim.workload.step_len_median=55.0", "engine.cost.mfu=0.5"]
    assert scoped([o], cell("nonspec", 8).overrides) == []  # the 7B cell keeps the shared value
    text = "name: x\nsim:\n  exact_one_share: 0.3\nload_format: checkpoint\n"
    once = write_model_workload(text, "step_len_median", 55.0, "FITTED")
    twice = write_model_workload(once, "step_len_median", 60.0, "FITTED")
    import yaml

    assert yaml.safe_load(once)["sim"]["workload"] == {"step_len_median": 55.0}
    assert yaml.safe_load(twice)["sim"] == {"exact_one_share": 0.3, "workload": {"step_len_median": 60.0}}
    assert yaml.safe_load(twice)["load_format"] == "checkpoint"


def test_a_pairs_workload_values_win_over_the_engine_profiles():
    from cfg_helpers import compose_spec
    from specscale.engine.synthetic.build import synthetic_workload

    base = synthetic_workload(compose_spec("model=qwen2.5-3b")).p
    own = synthetic_workload(compose_spec("model=qwen2.5-3b", "++model.sim.workload.step_len_median=77")).p
    assert own.step_len_median == 77 and base.step_len_median != 77
