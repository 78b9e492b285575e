"""The report's "Testbed" section: real accuracy on CPU (model=testbed, dataset=arith).

Reads the record of ``python -m runners.bench_testbed --out <dir>/testbed`` (see
``specscale.testbed.record``) from ``<results_dir>/testbed``, else the record committed
in the checkout (``results/testbed``), and the sim-vs-measured comparison of
``python -m runners.fit_testbed_workload`` from the same place. Draws accuracy vs beam
with Wilson intervals per policy, the strict vs shortcut paired differences, search vs
the sampling baselines, correct answers per second under latency budgets, the PRM's
step AUC and its reliability diagram, and the sim's predicted accuracy vs the measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pandas as pd

from analysis import testbed_tables as T
from analysis.output import Section, add_figure, add_table
from analysis.plots import ci_errors, finish_legend, log2_axis, panel_grid, policy_color, policy_style

SUBDIR = "testbed"
COMMITTED = Path(__file__).resolve().parents[1] / "results" / SUBDIR
BENCH_COMMAND = "python -m runners.bench_testbed --n-problems 500 --out <results_dir>/testbed"
TESTBED_NUMBERS = "measured: torch on CPU (the testbed record of runners.bench_testbed)"
FIT_COMMAND = "python -m runners.fit_testbed_workload --out <results_dir>/testbed"


def record_dir(results_dir: Optional[Path]) -> Optional[Path]:
    """<results_dir>/testbed when it holds a record, else the checkout's committed one."""
    for d in ([Path(results_dir) / SUBDIR] if results_dir is not None else []) + [COMMITTED]:
        if (d / "requests.csv").is_file():
            return d
    return None


# The sampling baselines' lines: each its own dash pattern and grey, told apart in print.
BASELINE_STYLES = ({"ls": ":", "color": "#555555"}, {"ls": "-.", "color": "#555555"},
                   {"ls": (0, (6, 2)), "color": "#999999"}, {"ls": (0, (2, 1, 2, 1, 6, 1)), "color": "#999999"})


def accuracy_figure(acc: pd.DataFrame, methods: Optional[pd.DataFrame], sim: Optional[pd.DataFrame]):
    fig, (ax,) = panel_grid(1, width=6.0, height=4.2)
    for policy, g in acc.groupby("policy", sort=False):
        lo, hi = ci_errors(g["accuracy"], g["ci_low"], g["ci_high"])
        jitter = 1 + 0.03 * (list(acc["policy"].unique()).index(policy) - 1.5)  # strict policies overlap exactly
        ax.errorbar(g["beam"] * jitter, g["accuracy"], yerr=[lo, hi], marker=policy_style(policy)["marker"], ms=4,
                    capsize=2, color=policy_color(policy), label=policy)
    if sim is not None and len(sim):
        for policy, g in sim.groupby("policy", sort=False):
            ax.plot(g["beam"], g["sim_accuracy"], ls="--", marker="x", color=policy_color(policy),
                    label=f"sim ({policy}, fitted profile)")
    if methods is not None:
        for (name, a), ls in zip(methods[["method", "accuracy"]].head(len(T.METHODS)).itertuples(index=False),
                                      BASELINE_STYLES):
            ax.axhline(a, lw=1, label=f"{name} (N={int(methods['samples'].iloc[0])})", **ls)
    log2_axis(ax, acc["beam"])
    ax.set_xlabel("beam N")
    ax.set_ylabel("accuracy (95% Wilson)")
    ax.set_title("Testbed accuracy vs beam: search, sim and sampling baselines", fontsize=9)
    finish_legend(ax, outside=True)
    return fig


def methods_figure(methods: pd.DataFrame):
    fig, (ax,) = panel_grid(1, width=6.0, height=3.4)
    lo, hi = ci_errors(methods["accuracy"], methods["ci_low"], methods["ci_high"])
    ax.barh(methods["method"], methods["accuracy"], xerr=[lo, hi], capsize=3, color="#4c72b0")
    ax.set_xlabel("accuracy (95% Wilson)")
    ax.set_xlim(0, 1)
    ax.set_title("Testbed: beam search vs sampling baselines", fontsize=9)
    return fig


def goodput_figure(gp: pd.DataFrame):
    budgets = sorted(gp["budget_s"].unique())
    fig, axes = panel_grid(len(budgets), width=4.2, height=3.4, max_cols=4)
    for ax, b in zip(axes, budgets):
        for policy, g in gp[gp["budget_s"] == b].groupby("policy", sort=False):
            ax.plot(g["beam"], g["correct_per_s"], label=policy, **policy_style(policy))
        log2_axis(ax, gp["beam"])
        ax.set_title(f"budget {b:g} s", fontsize=9)
        ax.set_xlabel("beam N")
        ax.set_ylabel("correct answers / s")
    finish_legend(axes[0])
    fig.suptitle("Testbed: correct answers per second within a latency budget", fontsize=10)
    return fig


def reliability_figure(cal: pd.DataFrame):
    sources = list(cal["source"].unique())
    fig, axes = panel_grid(len(sources), width=4.2, height=4.0)
    for ax, (source, g) in zip(axes, cal.groupby("source", sort=False)):
        ax.plot([0, 1], [0, 1], color="black", lw=1, label="perfectly calibrated")
        ax.plot(g["mean_score"], g["frac_right"], marker="o", color="#c44e52", label="PRM")
        for x, y, n in g[["mean_score", "frac_right", "steps"]].itertuples(index=False):
            ax.annotate(str(int(n)), (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points")
        ax.set_title(f"{source} steps (ECE {g['ece'].iloc[0]:.3f})", fontsize=9)
        ax.set_xlabel("PRM p(+) (bin mean)")
        ax.set_ylabel("share of right steps")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="upper left")
    return fig


def build_section(results_dir: Optional[Path], out: Path, budgets=None) -> Section:
    sec = Section("testbed", "Testbed (CPU, trained pair: model=testbed, dataset=arith)")
    src = record_dir(results_dir)
    if src is None:
        sec.missing.append(f"{sec.title}: no testbed record in {results_dir}/{SUBDIR} nor in the checkout "
                           f"({BENCH_COMMAND})")
        return sec
    meta = json.loads((src / "bench.json").read_text()) if (src / "bench.json").is_file() else {}
    req = pd.read_csv(src / "requests.csv")
    shown = "results/testbed (committed)" if src == COMMITTED else str(src)
    sec.notes.append(f"Record: `{shown}` ({meta.get('command', 'command not recorded')}; "
                     f"{req['problem_id'].nunique()} problems, seed {meta.get('seed', '?')}, "
                     f"engine=torch on CPU, {meta.get('threads', '?')} thread(s)).")
    acc = T.accuracy_vs_beam(req)
    add_table(sec, acc, out, "testbed_accuracy_vs_beam", "Accuracy vs beam (95% Wilson intervals)")
    if T.timing_noise(acc):
        sec.notes.append(T.timing_noise(acc))
    pairs = T.paired_differences(req)
    if len(pairs):
        add_table(sec, pairs, out, "testbed_paired", "Paired differences a - b on the same problems (bootstrap 95% "
                  "interval over problems, exact McNemar): the shortcut's cost (ep - ep_strict), full - nonspec, "
                  "and the equivalence contract (ep_strict - nonspec must be 0)")
        _contract_note(sec, pairs[(pairs["a"] == "ep_strict") & (pairs["b"] == "nonspec")])
    else:
        sec.missing.append(f"{sec.title}: no paired policies ({', '.join(f'{a}/{b}' for a, b in T.PAIRS)}) "
                           f"at a common beam in the record ({BENCH_COMMAND})")
    methods = None
    base_csv = src / "baselines.csv"
    n = int(meta.get("n", 8))
    if base_csv.is_file() and ((req["policy"] == "nonspec") & (req["beam"] == n)).any():
        methods = T.methods_at_n(req, pd.read_csv(base_csv), n)
        add_table(sec, methods, out, "testbed_methods", f"Search vs sampling baselines at N = {n}")
        add_figure(sec, methods_figure(methods), out, "testbed_methods", numbers=TESTBED_NUMBERS)
    else:
        sec.missing.append(f"{sec.title}: no baselines at N = {n} beside nonspec beam {n} ({BENCH_COMMAND})")
    sim = _sim_comparison(src, sec, out)
    add_figure(sec, accuracy_figure(acc, methods, sim), out, "testbed_accuracy_vs_beam",
               numbers=TESTBED_NUMBERS + ("; simulated: engine=sim synthetic=testbed" if sim is not None else ""))
    budgets = list(budgets) if budgets else T.default_budgets(req)
    gp = T.goodput(req, budgets)
    add_table(sec, T.goodput_wide(gp), out, "testbed_goodput", "Correct answers per second of makespan within a "
              "latency budget (budgets: quartiles and 95th percentile of the record's latencies)")
    add_figure(sec, goodput_figure(gp), out, "testbed_goodput", numbers=TESTBED_NUMBERS)
    steps_csv = src / "prm_steps.csv"
    if steps_csv.is_file():
        steps = pd.read_csv(steps_csv)
        add_table(sec, T.prm_auc(steps), out, "testbed_prm_auc", "PRM step AUC (right steps vs wrong steps; vs "
                  "first wrong steps only): sampled = the generator's own samples at T = 0.8 labelled by "
                  "checking them, planted = reference solutions with one planted error")
        cal = T.calibration(steps)
        add_table(sec, cal, out, "testbed_prm_calibration", "PRM reliability (10 equal-width bins of p(+))")
        add_figure(sec, reliability_figure(cal), out, "testbed_prm_reliability", numbers=TESTBED_NUMBERS)
    else:
        sec.missing.append(f"{sec.title}: no PRM step scores ({BENCH_COMMAND})")
    return sec


def _fit_record(src: Path, sec: Section, out: Path) -> None:
    """The fitted constants and what the fit saw (``workload_fit.json``): shared mistakes,
    the hazard by round and the PRM's ranking within a round, with the constants that
    carry each into the sim."""
    path = src / "workload_fit.json"
    if not path.is_file():
        return
    fit = json.loads(path.read_text())
    rows = [{"key": f"{group}.{k}", "value": str(v)} for group, node in
            (("engine.synthetic", fit["synthetic"]), ("engine.problems", fit["problems"]),
             ("dataset.sim", fit["dataset_sim"])) for k, v in node.items()]  # fmt: skip
    add_table(sec, pd.DataFrame(rows), out, "testbed_workload_fit",
              f"Fitted synthetic workload (conf/synthetic/testbed.yaml; {fit.get('command', '?')}, "
              f"{fit.get('members', '?')} round members on {fit.get('fit_problems', '?')} problems)")
    c = fit.get("checks", {})
    syn = fit["synthetic"]
    if "p_lost_given_sibling_lost" in c:
        sec.notes.append("On the testbed a child of an on-track parent goes wrong with p = "
                         f"{c['p_lost_after_round0']:.2f}, but with p = {c['p_lost_given_sibling_lost']:.2f} when a "
                         "sibling did. The fit tells apart what shares those mistakes (three searches of each fit "
                         f"problem): the problem's hard step, shared by every path at a round (problem_step_"
                         f"correlation {syn.get('problem_step_correlation', 0):g}), the parent (sibling_error_"
                         f"correlation {syn.get('sibling_error_correlation', 0):g}) and identical siblings.")
    if "step_hazard_by_round" in c:
        sec.notes.append("Step hazard by round on the testbed (children of on-track parents): " +
                         ", ".join(f"{k}: {v:.3f}" for k, v in c["step_hazard_by_round"].items()) +
                         f"; the sim's falls by error_round_decay {syn.get('error_round_decay', 1):g} a round from "
                         f"a mean of {fit['dataset_sim']['difficulty_mean']:.3f} x error_rate {syn['error_rate']:g}.")
    if "within_round_auc" in c:
        sec.notes.append(f"The testbed's PRM ranks an on-track step above an off-track one of the same round "
                         f"{c['within_round_auc']:.1%} of the time; the sim matches it with prm_step_sensitivity "
                         f"{syn.get('prm_step_sensitivity', 1):g} (fitted through the sim).")


def _contract_note(sec: Section, contract: pd.DataFrame) -> None:
    if len(contract):
        differ = int((contract["only_a_correct"] + contract["only_b_correct"]).sum())
        sec.notes.append(f"Strict pruning vs nonspec: {differ} discordant problem(s) over {len(contract)} beam(s) "
                         f"({'identical outcomes' if differ == 0 else 'the contract is BROKEN in float32 here'}).")


def _sim_comparison(src: Path, sec: Section, out: Path) -> Optional[pd.DataFrame]:
    path = src / "sim_vs_measured.csv"
    if not path.is_file():
        sec.missing.append(f"{sec.title}: no sim-vs-measured accuracy comparison ({FIT_COMMAND})")
        return None
    sim = pd.read_csv(path)
    add_table(sec, sim, out, "testbed_sim_vs_measured", "Accuracy vs beam: the sim with the fitted testbed "
              "workload (synthetic=testbed) vs measured on the testbed")
    inside = int(sim["within_measured_ci"].sum())
    err = (sim["sim_accuracy"] - sim["accuracy"]).abs()
    miss = sim.loc[~sim["within_measured_ci"]]
    sec.notes.append(f"Sim vs measured accuracy: {inside}/{len(sim)} predictions inside the measured 95% interval; "
                     f"mean |error| {err.mean():.3f}, max {err.max():.3f}" +
                     (f"; MISSES: {', '.join(f'{p} beam {b}' for p, b in zip(miss['policy'], miss['beam']))}"
                      if len(miss) else "") + ".")
    for policy, g in sim.groupby("policy", sort=False):
        g = g.sort_values("beam")
        if len(g) > 1:
            sec.notes.append(f"{policy}, beam {g['beam'].iloc[0]} -> {g['beam'].iloc[-1]}: accuracy gain "
                             f"{g['sim_accuracy'].iloc[-1] - g['sim_accuracy'].iloc[0]:+.3f} in the sim vs "
                             f"{g['accuracy'].iloc[-1] - g['accuracy'].iloc[0]:+.3f} measured.")
    _fit_record(src, sec, out)
    return sim
