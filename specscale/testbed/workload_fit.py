"""Fit the sim's synthetic-workload constants (``WorkloadParams`` and the synthetic
problems' difficulty spread) to labelled testbed search traces (``traces.member_frame``).

Each constant is matched to the statistic the sim's model draws it from
(``specscale.engine.synthetic.workload``):

* step length (tokens, delimiter included) and steps per finished path: the sim draws
  them from a log-normal discretised by ceil, so both are fitted by maximum likelihood of
  that discretised law (scipy.optimize), not by a continuous fit to integers;
* ``token_overlap`` / ``head_overlap``: the probability that two siblings drawing from
  the same history pick the same token, which is what the sim sets directly: estimated
  over sibling pairs at each position while their step prefixes are still identical
  (body and the first ``head_tokens`` positions apart);
* ``error_rate`` x difficulty: the sim loses a path at a step with probability
  error_rate * d, d ~ Beta(c m, c (1 - m)) per problem. Children of on-track parents
  are fresh draws of that hazard, so (lost, tried) per problem is beta-binomial: its
  maximum-likelihood (a, b) give m = a / (a + b), c = a + b with error_rate = 1;
* PRM rewards: the share of exact 1.0 on track, its ratio off track, and Beta(a, b)
  fits (scipy.stats.beta.fit, support fixed to [0, 1]) of the other scores on and off
  track;
* ``wrong_answers``: the sim picks one of W wrong answers uniformly, so two wrong
  finished paths of a problem agree with probability 1 / W: W = 1 / that rate;
* prompt length: a log-normal mean and shape of the prompts' token counts.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, stats

HEAD_TOKENS = 3
EPS = 1e-6
MAX_OVERLAP = 0.995  # the sim needs overlap < 1 (its Zipf law cannot put all mass on one token)


@dataclass
class FittedWorkload:
    synthetic: dict  # engine.synthetic (WorkloadParams fields)
    problems: dict  # engine.problems (difficulty_concentration, prompt_tokens_sigma)
    dataset_sim: dict  # dataset.sim (difficulty_mean, prompt_tokens_mean)
    checks: dict = field(default_factory=dict)  # what the fit saw: sizes, per-level hazards, raw shares

    def as_dict(self) -> dict:
        return asdict(self)


def _r(v, digits: int) -> float:
    """A plain Python float (numpy scalars are not YAML-safe), rounded for the profile."""
    return round(float(v), digits)


def discrete_lognormal_fit(values) -> tuple[float, float]:
    """(median, sigma) maximising sum log P(L = v), P(L = v) = F(v) - F(v - 1) for the
    log-normal F: the law ``lognormal_hazard`` discretises."""
    v = np.asarray(values, dtype=float)
    uniq, counts = np.unique(v, return_counts=True)

    def nll(theta):
        mu, log_s = theta
        s = math.exp(log_s)
        hi = stats.norm.cdf((np.log(uniq) - mu) / s)
        lo = np.where(uniq > 1, stats.norm.cdf((np.log(np.maximum(uniq - 1, 1e-300)) - mu) / s), 0.0)
        return -float(np.sum(counts * np.log(np.maximum(hi - lo, 1e-300))))

    x0 = [float(np.log(np.median(v) - 0.5)) if np.median(v) > 1 else 0.0, math.log(max(np.log(v).std(), 0.05))]
    res = optimize.minimize(nll, x0, method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-9, "maxiter": 4000})
    return float(math.exp(res.x[0])), float(math.exp(res.x[1]))


def sibling_collision(members: pd.DataFrame, head_tokens: int = HEAD_TOKENS) -> tuple[float, float, float]:
    """(head, body, share): P(same next token | same step prefix) over sibling pairs, at the
    first head_tokens positions and after; and the share of positions (up to the shorter
    step) where a pair holds the same token, the statistic ``measure_sibling_overlap`` gives."""
    same = {"head": [0, 0], "body": [0, 0]}
    shares = []
    for _, g in members[members["parent"].notna()].groupby("group"):
        for a, b in itertools.combinations(g["tokens"].tolist(), 2):
            n = min(len(a), len(b))
            if n == 0:
                continue
            shares.append(sum(x == y for x, y in zip(a[:n], b[:n])) / n)
            for t in range(n):
                part = same["head" if t < head_tokens else "body"]
                part[1] += 1
                if a[t] != b[t]:
                    break
                part[0] += 1
    head, body = (same[k][0] / same[k][1] if same[k][1] else float("nan") for k in ("head", "body"))
    return head, body, float(np.mean(shares)) if shares else float("nan")


def hazard_fit(members: pd.DataFrame) -> tuple[float, float, pd.DataFrame]:
    """Beta-binomial MLE of the per-problem step hazard; returns (mean, concentration, the
    per-problem (lost, tried) table)."""
    tried = members[members["parent_on_track"]]
    per = tried.groupby(["problem_id", "level"]).agg(tried=("on_track", "size"),
                                                     lost=("on_track", lambda s: int((~s).sum()))).reset_index()

    def nll(theta):
        a, b = np.exp(theta)
        return -float(stats.betabinom.logpmf(per["lost"], per["tried"], a, b).sum())

    m0 = max(per["lost"].sum() / per["tried"].sum(), 1e-3)
    res = optimize.minimize(nll, [math.log(m0 * 4), math.log((1 - m0) * 4)], method="Nelder-Mead")
    a, b = np.exp(res.x)
    return float(a / (a + b)), float(a + b), per


def sibling_loss_correlation(members: pd.DataFrame) -> tuple[float, float]:
    """(P(a child of an on-track parent is lost), P(it is lost | a sibling is lost)): the sim
    draws each distinct child's loss independently, so the two agree there; on real traces
    a step the generator gets wrong tends to be wrong for every sibling."""
    tried = members[members["parent_on_track"] & members["parent"].notna()]
    pairs = lost_pairs = 0
    for _, g in tried.groupby("group"):
        lost = int((~g["on_track"]).sum())
        pairs += lost * (len(g) - 1)  # ordered pairs (a lost, b another sibling)
        lost_pairs += lost * (lost - 1)
    p = float((~tried["on_track"]).mean()) if len(tried) else float("nan")
    return p, lost_pairs / pairs if pairs else float("nan")


def beta_fit(scores) -> tuple[float, float]:
    x = np.clip(np.asarray(scores, dtype=float), EPS, 1 - EPS)
    a, b, _, _ = stats.beta.fit(x, floc=0, fscale=1)
    return float(a), float(b)


def wrong_answer_count(members: pd.DataFrame, answers: dict[str, str]) -> int:
    """1 / P(two wrong finished answers of a problem agree), at least 1."""
    agree, pairs = 0, 0
    done = members[members["terminal"] & members["answer"].notna()]
    for pid, g in done.groupby("problem_id"):
        wrong = [a for a in g["answer"] if a != answers[pid]]
        for x, y in itertools.combinations(wrong, 2):
            pairs += 1
            agree += x == y
    return max(1, round(pairs / agree)) if agree else max(1, len(done))


def fit(members: pd.DataFrame, prompt_tokens, answers: dict[str, str]) -> FittedWorkload:
    step_med, step_sig = discrete_lognormal_fit(members["n_tokens"][members["n_tokens"] > 0])
    finished = members[members["terminal"]]
    steps_med, steps_sig = discrete_lognormal_fit(finished["round"] + 1)
    head, body, share = sibling_collision(members)
    d_mean, d_conc, per = hazard_fit(members)
    on, off = members[members["on_track"]], members[~members["on_track"]]
    on_one, off_one = float((on["score"] >= 1.0).mean()), float((off["score"] >= 1.0).mean())
    on_beta = beta_fit(on.loc[on["score"] < 1.0, "score"])
    off_beta = beta_fit(off.loc[off["score"] < 1.0, "score"])
    p_mean = float(np.mean(prompt_tokens))
    p_sig = float(np.log(np.asarray(prompt_tokens, dtype=float)).std()) or 0.01
    by_level = per.groupby("level")[["lost", "tried"]].sum()
    p_lost, p_lost_sib = sibling_loss_correlation(members)
    synthetic = {
        "token_overlap": _r(min(body, MAX_OVERLAP), 4), "head_overlap": _r(min(head, MAX_OVERLAP), 4),
        "head_tokens": HEAD_TOKENS, "step_len_median": _r(step_med, 3), "step_len_sigma": _r(step_sig, 4),
        "steps_median": _r(steps_med, 3), "steps_sigma": _r(steps_sig, 4), "error_rate": 1.0,
        "exact_one_share": _r(on_one, 4),
        "off_track_one_factor": _r(off_one / on_one, 4) if on_one > 0 else 0.0,
        "on_beta": [_r(v, 4) for v in on_beta], "off_beta": [_r(v, 4) for v in off_beta],
        "wrong_answers": wrong_answer_count(members, answers),
    }  # fmt: skip
    checks = {
        "members": len(members), "problems": int(members["problem_id"].nunique()), "finished_paths": len(finished),
        "sibling_token_share": _r(share, 4), "on_track_steps": len(on), "off_track_steps": len(off),
        "exact_one_on_track": on_one, "exact_one_off_track": off_one,
        "on_track_score_mean": float(on["score"].mean()), "off_track_score_mean": float(off["score"].mean()),
        "step_hazard_by_level": {int(k): _r(r["lost"] / r["tried"], 4) for k, r in by_level.iterrows()},
        "step_hazard_overall": _r(float(per["lost"].sum() / per["tried"].sum()), 4),
        "step_hazard_by_round": {int(k): _r((~g["on_track"]).mean(), 4) for k, g in
                                 members[members["parent_on_track"]].groupby("round")},
        "p_lost_after_round0": _r(p_lost, 4), "p_lost_given_sibling_lost": _r(p_lost_sib, 4),
        "steps_by_level": {int(k): float(g["round"].mean() + 1) for k, g in finished.groupby("level")},
    }  # fmt: skip
    return FittedWorkload(
        synthetic=synthetic,
        problems={"difficulty_concentration": _r(d_conc, 4), "prompt_tokens_sigma": _r(p_sig, 4)},
        dataset_sim={"difficulty_mean": _r(d_mean, 4), "prompt_tokens_mean": _r(p_mean, 2)},
        checks=checks,
    )
