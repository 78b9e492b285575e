"""Fit the sim's synthetic-workload constants (``WorkloadParams`` and the synthetic
problems' difficulty spread) to labelled testbed search traces (``traces.member_frame``).

Each constant is matched to the statistic the sim's model draws it from
(``specscale.engine.synthetic.workload``). A *sibling group* is every child of one
parent *history* (the request and the token ids of every step so far, ``history_groups``;
round 0: the request's root): two selected parents that wrote the same text are one
history, as they are for the sim (same end hash, same distributions and shared draws).

* step length (tokens, delimiter included) and steps per finished path: the sim draws
  them from a log-normal discretised by ceil, so both are fitted by maximum likelihood of
  that discretised law (scipy.optimize), not by a continuous fit to integers;
* ``identical_step_rate`` q and ``undetermined_round_decay`` u: the sim makes a share
  q_r = 1 - (1 - q) u^r of round r's steps *determined* (every sibling writes the same
  text; later steps more often, as the path settles); otherwise siblings write the same
  whole step only by chance. So (q, u) maximise the likelihood of whether each sibling
  group (>= 2 members, round r = its children's round) has all its members' steps
  identical (same token ids), which it has with probability q_r + (1 - q_r) chance,
  chance = the probability that the sim, without determined steps, gives m siblings of
  round r identical steps (``chance_identical``; ``identical_step_fit``, fitted before
  the loss law, which takes q_r as given: the all-identical counts of every group carry
  the share, the loss law only the on-track parents' groups):
  at every position all m draw the same token (sum_k p_k^m over the content law with
  the fitted overlaps, times the step-length hazard's continue probability^m) and all m
  stop at the same position with the same end token. (The approximation
  token_overlap^((m-1) x length), the product of per-position overlaps over the observed
  length, leaves out that the sim draws each sibling's stop independently, so it puts
  the chance far too high: it is reported as ``identical_chance_overlap_power``);
* ``token_overlap`` / ``head_overlap``: the probability that two siblings drawing from
  the same history pick the same token, which is what the sim sets directly for the
  steps it does not determine, given both write a content token: estimated over sibling
  pairs at each content position (before the shorter step's end token) while their step
  prefixes are still identical (body and the first ``head_tokens`` positions apart),
  in sibling groups whose steps are not all identical (the determined ones; the overlap
  over every group is reported as ``overlap_all_groups``);
* difficulty (integrated per *problem*: the traces hold several independent searches of
  each, so a problem hard in every search is told from a group failing together),
  ``error_round_decay``, ``sibling_error_correlation`` and
  ``determined_hazard_factor`` f_d, jointly (``error_law_fit``): the sim loses the child
  of an on-track parent in round r with hazard h = error_rate * d * round_factor(r) *
  f, d ~ Beta(c m, c (1 - m)) per problem, round_factor(r) = n (1 - g) / (1 - g^n) g^r
  with n = round(steps_median), f = f_d when the step is determined and
  (1 - q_r f_d) / (1 - q_r) otherwise (mean 1 over round r's steps: a determined step is one every
  sibling writes, as a real model writes the steps it is sure of, and those are rarely
  the ones that go wrong), comparing h with its parent's shared uniform (probability
  rho) or its own, so that P(a sibling lost | another lost) = rho^2 + (1 - rho^2) h for
  distinct steps; siblings with identical steps share one fate. Whether a step is
  determined is a function of the history it starts from, so all siblings share it.
  The fit maximises that model's likelihood of each sibling group's number of lost
  children together with whether its members all wrote the identical step (m, c, g,
  rho, f_d free, error_rate = 1, q_r from the fitted (q, u), d integrated out per
  problem): a group is determined with probability q_r (all identical, hazard x f_d), else
  its identical-step pattern is drawn from the law the sim gives the other steps with
  the fitted text constants (``simulated_patterns`` with q = 0: overlaps, step lengths;
  all identical by chance ~2e-4, ``identical_share_chance``) and its hazard is x (1 - q_r
  f_d) / (1 - q_r). So an all-identical group is read as determined, and the finer pattern
  of the others is drawn from the law, not read from the group (within the steps it does
  not determine, the sim draws text and fate apart). f_d is bounded to [1e-3, min(1 / q,
  5)] (1 / q: round 0's other steps never err; in later rounds q_r f_d may pass 1, and
  the other steps' factor is then 0, as in the sim) and is 1 when q = 0. Checks:
  ``loss_by_determined`` (the lost share of the members of all-identical groups and of
  the others, on-track parents, >= 2 members), ``determined_hazard_factors`` (the two
  multipliers at round 0; ``determined_hazard_factors_by_round`` per round),
  ``identical_share_by_round`` (the observed and fitted shares of all-identical groups
  and q_r), and the fit without f_d with the traces' own pattern law
  (``error_law_fit_traces_patterns``: every step hazard h, each group's pattern drawn
  from the traces' law of its size, not read from it). So
  error_rate x difficulty is read as the mean hazard over a median-length path (the
  first round(steps_median) rounds), as the sim normalises it, and the four spreads of
  the hazard are told apart as the sim draws them: across problems (difficulty), rounds
  (decay), parents (correlation) and determined steps versus the others (f_d). Pooled
  statistics confound them and are reported
  as checks only: ``p_lost_given_sibling_lost`` with rho_pooled = sqrt((c - p) / (1 -
  p)) over all sibling pairs (identical siblings and the spread of difficulty alone make
  it large), the per-round hazards with the binomial MLE of h0 g^r over them
  (``error_round_decay_pooled``: which problems reach later rounds is selected), and the
  beta-binomial fit of per-problem (lost, tried) counts (``difficulty_betabinomial``,
  which reads clustered losses as a spread of difficulty);
* PRM rewards: the share of exact 1.0 on track, its ratio off track, and Beta(a, b)
  fits (scipy.stats.beta.fit, support fixed to [0, 1]) of the other scores on and off
  track;
* ``within_round_auc`` (a check the sim does not match: its on/off Beta draws are
  independent, so it ranks the steps of one round as well as its pooled AUC says, where
  the testbed's PRM ranks them much worse than its pooled AUC);
* ``wrong_answers``: the sim picks one of W wrong answers uniformly, so two wrong
  finished paths of a problem agree with probability 1 / W: W = 1 / that rate;
* ``off_track_correct_share``: the share of off-track finished paths whose answer is
  still the reference (an error that did not change the result);
* prompt length: a log-normal mean and shape of the prompts' token counts.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, special, stats

from specscale.engine.synthetic.workload import WorkloadParams, lognormal_hazard, zipf_exponent

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


def steps_problem_fit(problem_ids, steps, grid: int = 400) -> dict:
    """(median, sigma within a problem, sigma across problems): the sim's steps law with a
    problem's own median (``steps_problem_sigma``), log(median_p) = mu + s_p z_p, each of
    the problem's paths L = ceil(X), X ~ LogNormal(log median_p, s_w), by maximum
    likelihood with z_p integrated out per problem on ``grid`` normal quantiles (fine:
    with s_w small a problem's likelihood is a narrow spike in z). Starts: the pooled
    discrete fit (``discrete_lognormal_fit``) split evenly between the two sigmas, and all
    of it within. s_w on [0.01, 3], s_p on [0, 3]. Also the nll of the best fit with s_p = 0
    (the pooled law)."""
    # One row per (problem, step count) with its multiplicity: a problem's paths mostly
    # share one count, so the likelihood sums over far fewer rows than paths.
    cells = pd.DataFrame({"p": np.asarray(problem_ids).astype(str), "v": np.asarray(steps, dtype=float)})
    cells = cells.groupby(["p", "v"]).size().reset_index(name="n")  # sorted by problem
    v, n = cells["v"].to_numpy(), cells["n"].to_numpy(dtype=float)[:, None]
    starts = np.flatnonzero(np.r_[True, cells["p"].to_numpy()[1:] != cells["p"].to_numpy()[:-1]])
    log_hi, log_lo = np.log(v), np.log(np.maximum(v - 1.0, 1e-300))
    z = special.ndtri((np.arange(grid) + 0.5) / grid)

    def nll(theta) -> float:
        mu, s_w, s_p = theta
        m = mu + s_p * z[None, :]  # [1, grid]
        hi = special.ndtr((log_hi[:, None] - m) / s_w)
        lo = np.where(v[:, None] > 1, special.ndtr((log_lo[:, None] - m) / s_w), 0.0)
        per = np.add.reduceat(n * np.log(np.maximum(hi - lo, 1e-300)), starts, axis=0)  # [problems, grid]
        return -float((special.logsumexp(per, axis=1) - math.log(grid)).sum())

    med0, sig0 = discrete_lognormal_fit(np.repeat(v, n[:, 0].astype(int)))
    bounds = [(None, None), (0.01, 3.0), (0.0, 3.0)]
    best = None
    for x0 in ([math.log(med0), sig0 / math.sqrt(2), sig0 / math.sqrt(2)], [math.log(med0), sig0, 0.0]):
        res = optimize.minimize(nll, x0, method="L-BFGS-B", bounds=bounds)
        if best is None or res.fun < best.fun:
            best = res
    pooled = optimize.minimize(lambda t: nll([t[0], t[1], 0.0]), [math.log(med0), sig0], method="L-BFGS-B",
                               bounds=bounds[:2])  # fmt: skip
    mu, s_w, s_p = (float(x) for x in best.x)
    return {"median": math.exp(mu), "sigma": s_w, "problem_sigma": s_p, "nll": float(best.fun),
            "status": "converged" if best.success else str(best.message), "nll_pooled": float(pooled.fun),
            "problems": int(len(starts)), "paths": int(n.sum())}  # fmt: skip


def collision_counts(members: pd.DataFrame, head_tokens: int = HEAD_TOKENS, group: str = "group") -> dict:
    """Sibling-pair counts behind ``sibling_collision``, apart for groups whose steps are
    all identical ("identical") and the others ("varied"): {part: {"head": [same, seen],
    "body": [same, seen], "shares": [...], "positions": {t: [same, seen]}, "lengths":
    [(group size, all one length), ...]}} (positions and lengths filled for varied groups:
    what ``position_collision`` and ``sibling_length_fit`` read)."""
    out = {part: {"head": [0, 0], "body": [0, 0], "shares": [], "positions": {}, "lengths": []}
           for part in ("identical", "varied")}  # fmt: skip
    rows = members if group != "group" else members[members["parent"].notna()]
    by: dict = {}
    for g, toks in zip(rows[group].tolist(), rows["tokens"].tolist()):
        by.setdefault(g, []).append(toks)
    for steps in by.values():
        if len(steps) < 2:
            continue
        if all(t == steps[0] for t in steps[1:]):  # every pair agrees at every position
            part, n = out["identical"], len(steps[0])
            pairs = len(steps) * (len(steps) - 1) // 2
            if n:
                part["shares"] += [1.0] * pairs
                head = min(n - 1, head_tokens)
                part["head"][0] += pairs * head
                part["head"][1] += pairs * head
                part["body"][0] += pairs * (n - 1 - head)
                part["body"][1] += pairs * (n - 1 - head)
            continue
        part = out["varied"]
        part["lengths"].append((len(steps), len({len(t) for t in steps}) == 1))
        for a, b in itertools.combinations(steps, 2):
            n = min(len(a), len(b))
            if n == 0:
                continue
            part["shares"].append(sum(x == y for x, y in zip(a[:n], b[:n])) / n)
            for t in range(n - 1):  # content positions: each step's last token is its end token
                pos, at = part["head" if t < head_tokens else "body"], part["positions"].setdefault(t, [0, 0])
                pos[1] += 1
                at[1] += 1
                if a[t] != b[t]:
                    break
                pos[0] += 1
                at[0] += 1
    return out


def sibling_collision(members: pd.DataFrame, head_tokens: int = HEAD_TOKENS, group: str = "group",
                      skip_identical: bool = False, counts: dict | None = None) -> tuple[float, float, float]:  # fmt: skip
    """(head, body, share): P(same next token | same step prefix) over sibling pairs, at the
    first head_tokens positions and after, at positions where both still write content
    (before the shorter step's end token: the sim draws the stop apart, from the step
    length law, and sets the overlap on content tokens); and the share of positions (up
    to the shorter step) where a pair holds the same token, the statistic
    ``measure_sibling_overlap`` gives. Siblings are the rows sharing ``group`` (by default
    the parent key, round 0 left out); skip_identical leaves out groups whose steps are
    all identical (the sim's determined steps, which its overlaps do not draw). counts:
    ``collision_counts`` already taken."""
    counts = counts if counts is not None else collision_counts(members, head_tokens, group)
    parts = [counts["varied"]] + ([] if skip_identical else [counts["identical"]])
    rate = []
    for pos in ("head", "body"):
        same, seen = (sum(p[pos][i] for p in parts) for i in (0, 1))
        rate.append(same / seen if seen else float("nan"))
    shares = [x for p in parts for x in p["shares"]]
    return rate[0], rate[1], float(np.mean(shares)) if shares else float("nan")


def position_collision(counts: dict, min_pairs: int = 500, vocab: int = 128) -> list[float]:
    """P(same next token | same step prefix, both write content) at positions 0, 1, ... of
    a step, over the varied groups' sibling pairs (``collision_counts``): the sim's
    ``token_overlap_by_position``, up to the first position with fewer than ``min_pairs``
    pairs, each clipped into the Zipf law's range (1/vocab, MAX_OVERLAP]."""
    out = []
    positions = counts["varied"]["positions"]
    for t in range(len(positions)):
        same, seen = positions.get(t, (0, 0))
        if seen < min_pairs:
            break
        out.append(float(min(MAX_OVERLAP, max(1.0 / vocab + 1e-3, same / seen))))
    return out


def length_chance(params: WorkloadParams, m: int, max_len: int = 1024) -> float:
    """P(m siblings end their steps at one length) when each draws its length apart from
    the step-length law (``lognormal_hazard``): sum over L of P(L)^m."""
    return float((params.step_length_pmf(max_len) ** m).sum())


def sibling_length_fit(counts: dict, params: WorkloadParams) -> dict:
    """``sibling_length_share`` lambda by maximum likelihood of whether each varied sibling
    group's steps have one length: with probability lambda they take it from where the
    step began, else each draws its own and they agree by chance (``length_chance``).
    Also the observed share."""
    groups = counts["varied"]["lengths"]
    if not groups:
        return {"share": 0.0, "observed": float("nan"), "groups": 0}
    m = np.array([g[0] for g in groups])
    y = np.array([g[1] for g in groups], dtype=bool)
    chance = np.array([length_chance(params, int(k)) for k in m])

    def nll(lam: float) -> float:
        p = np.clip(lam + (1.0 - lam) * chance, 1e-12, 1.0 - 1e-12)
        return -float(np.where(y, np.log(p), np.log1p(-p)).sum())

    res = optimize.minimize_scalar(nll, bounds=(0.0, 1.0), method="bounded")
    return {"share": float(res.x), "observed": float(y.mean()), "chance": float(chance.mean()), "groups": len(groups)}


def history_groups(members: pd.DataFrame) -> pd.Series:
    """Each row's sibling group: (problem, its parent's history), the history being the
    token ids of every step of the path; round-0 rows: (problem, None). Parents that
    wrote the same text share one history, as they share one in the sim, in one search
    or across several searches of the problem (the sim's draws are functions of the
    history: the same text has the same fate, and its children the same parent draw).
    Frames without a problem_id column group by request."""
    ids: dict[tuple, int] = {}
    hist_of: dict[int, int] = {}
    for key, parent, toks in members.sort_values("round", kind="stable")[["key", "parent", "tokens"]].itertuples(
            index=False):  # fmt: skip
        up = None if parent is None else hist_of[parent]
        hist_of[key] = ids.setdefault((up, tuple(toks)), len(ids))
    owner = members["problem_id"] if "problem_id" in members.columns else members["request_id"]
    return pd.Series([(o, None if p is None else hist_of[p]) for o, p in zip(owner, members["parent"])],
                     index=members.index, dtype=object)  # fmt: skip


def sibling_groups(members: pd.DataFrame) -> pd.DataFrame:
    """One row per sibling group (``history_groups``): problem, round, size m, lost children (when the parent is
    on track), parent_on_track, the identical-step pattern ``blocks`` (sorted sizes of
    the sets of siblings with the same token ids) and whether all are identical, and the
    length of its first step."""
    by: dict = {}
    cols = zip(history_groups(members).tolist(), members["round"].tolist(), members["tokens"].tolist(),
               members["on_track"].tolist(), members["parent_on_track"].tolist())  # fmt: skip
    for h, rnd, toks, ok, parent_ok in cols:
        by.setdefault(h, []).append((rnd, tuple(toks), ok, parent_ok))
    rows = []
    for h, kids in by.items():
        sizes: dict[tuple, int] = {}
        for _, toks, _, _ in kids:
            sizes[toks] = sizes.get(toks, 0) + 1
        rows.append((h[0], int(kids[0][0]), len(kids), sum(not k[2] for k in kids), bool(kids[0][3]),
                     tuple(sorted(sizes.values(), reverse=True)), len(sizes) == 1, len(kids[0][1])))  # fmt: skip
    return pd.DataFrame(rows, columns=["problem_id", "round", "m", "lost", "parent_on_track", "blocks", "identical",
                                       "n_tokens"])  # fmt: skip


def chance_identical(params: WorkloadParams, m: int, r: int, max_len: int = 1024) -> float:
    """P(m siblings of round r write the same whole step) in the sim without determined
    steps: at every position all m draw the same content token (sum_k p_k^m of the Zipf
    law with that position's overlap, ``WorkloadParams.position_overlaps``), and all stop
    at the same position with the same end token (EOS versus delimiter by the steps law's
    hazard at r completed steps): each by the length law's hazard ((1 - stop)^m to go on,
    stop^m to end together), or, for a share ``sibling_length_share`` of steps, all at the
    length drawn at the step's start. Each sibling draws with its own uniform, top_p = 1."""
    vc = params.content_vocab
    ranks = np.arange(1, vc + 1, dtype=np.float64)
    overlaps = params.position_overlaps()
    same_by = []
    for overlap in overlaps:
        w = ranks ** -zipf_exponent(vc, overlap)
        same_by.append(float(((w / w.sum()) ** m).sum()))
    stop = lognormal_hazard(params.step_len_median, params.step_len_sigma, max_len)
    e = lognormal_hazard(params.steps_median, params.steps_sigma, 256)[min(r, 255)]
    same = np.asarray(same_by)[np.minimum(np.arange(max_len), len(same_by) - 1)]
    ends = e ** m + (1.0 - e) ** m
    cont = (1.0 - stop) ** m * same
    before = np.concatenate([[1.0], np.cumprod(cont)[:-1]])  # all identical through position t - 1
    apart = float((before * stop ** m).sum()) * ends
    lam = params.sibling_length_share
    if lam == 0.0:
        return apart
    content_same = np.concatenate([[1.0], np.cumprod(same)[:-1]])  # the same content before position t
    together = float((params.step_length_pmf(max_len) * content_same).sum()) * ends  # length t + 1
    return lam * together + (1.0 - lam) * apart


def identical_step_fit(groups: pd.DataFrame, params: WorkloadParams, problem_spread: bool = True,
                       nodes: int = 24) -> dict:  # fmt: skip
    """(q, u, tau): the determined share q_r = 1 - (1 - q) u^r of round r (the sim's
    ``WorkloadParams.determined_share``, u = ``undetermined_round_decay``) and its spread
    across problems, logit(q_pr) = logit(q_r) + tau z_p with z_p ~ N(0, 1) per problem
    (``determined_problem_spread``), by maximum likelihood of whether each sibling group
    of >= 2 members (every group, on track or not: the sim determines steps whatever the
    path's state) is all identical, which it is with probability q_pr + (1 - q_pr)
    chance(m, r) (``chance_identical``: the other steps' text law). z_p is integrated
    out per problem (over every search of it) by Gauss-Hermite quadrature on ``nodes``
    nodes, so tau reads how a problem's groups agree beyond their rounds. q on [0, 1], u
    on [0.05, 1], tau on [0, 5] (fixed to 0 when ``problem_spread`` is false); u is 1
    (unidentified) when q is 0. With u = 1 and tau = 0 this is the constant share the
    pooled q = (observed - chance) / (1 - chance) estimates. Also the observed and fitted
    shares of all-identical groups by round (the fitted share averaged over the problems'
    draws), the mean chance and the chance the approximation
    overlap^((m-1) x length) gives (product over the first step's positions, head
    positions with the head overlap)."""
    g = groups[groups["m"] >= 2]
    if not len(g):
        return {"q": 0.0, "u": 1.0, "spread": 0.0, "groups": 0, "observed": float("nan"), "chance": float("nan"),
                "chance_overlap_power": float("nan"), "by_round": {}}  # fmt: skip
    memo: dict[tuple[int, int], float] = {}
    chance = np.array([memo.setdefault((m, r), chance_identical(params, m, r)) for m, r in zip(g["m"], g["round"])])
    head = np.minimum(g["n_tokens"], params.head_tokens)
    power = (params.head_overlap ** head * params.token_overlap ** (g["n_tokens"] - head)) ** (g["m"] - 1)
    # Groups ordered by problem, so each problem's rows are one block of the quadrature's sums
    # (without problem ids every group is its own problem and no spread is read).
    problem_spread = problem_spread and "problem_id" in g
    ids = g["problem_id"].astype(str).to_numpy() if problem_spread else np.arange(len(g))
    _, pidx = np.unique(ids, return_inverse=True)
    order = np.argsort(pidx, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(pidx[order]) != 0])
    r = g["round"].to_numpy(dtype=float)[order]
    c, y = chance[order], g["identical"].to_numpy(dtype=bool)[order]
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    log_w = np.log(w / w.sum())

    def nll(theta) -> float:
        q, u, tau = theta
        q_r = 1.0 - (1.0 - q) * u ** np.maximum(r, 0.0)
        with np.errstate(divide="ignore"):
            q_pr = special.expit(special.logit(q_r)[:, None] + tau * z[None, :])  # [groups, nodes]
        p = np.clip(q_pr + (1.0 - q_pr) * c[:, None], 1e-12, 1.0 - 1e-12)
        ll = np.where(y[:, None], np.log(p), np.log1p(-p))
        per = np.add.reduceat(ll, starts, axis=0)  # [problems, nodes]
        return -float(special.logsumexp(per + log_w, axis=1).sum())

    bounds = [(0.0, 1.0), (0.05, 1.0), (0.0, 5.0 if problem_spread else 0.0)]
    best = None
    for x0 in ([0.5, 1.0], [0.2, 0.7], [0.05, 0.3]):
        for tau0 in ((0.0, 1.0) if problem_spread else (0.0,)):
            res = optimize.minimize(nll, [*x0, tau0], method="L-BFGS-B", bounds=bounds)
            if best is None or res.fun < best.fun:
                best = res
    q, u, tau = (float(v) for v in best.x)
    if q <= 1e-6 or q >= 1.0 - 1e-6:
        u = 1.0  # the share is the same in every round
    q_by = 1.0 - (1.0 - q) * u ** np.maximum(g["round"].to_numpy(dtype=float), 0.0)
    with np.errstate(divide="ignore"):  # the share averaged over the problems' draws
        q_mix = special.expit(special.logit(q_by)[:, None] + tau * z[None, :]) @ (w / w.sum())
    fitted = q_mix + (1.0 - q_mix) * chance
    by_round = {int(rd): {"groups": int(len(sub)), "observed": float(sub["identical"].mean()),
                          "fitted": float(fitted[g["round"].to_numpy() == rd].mean()),
                          "determined_share": float(1.0 - (1.0 - q) * u ** max(int(rd), 0))}
                for rd, sub in g.groupby("round")}  # fmt: skip
    return {"q": min(1.0, max(0.0, q)), "u": u, "spread": tau, "groups": len(g),
            "observed": float(g["identical"].mean()),
            "chance": float(chance.mean()), "chance_overlap_power": float(power.mean()), "nll": float(best.fun),
            "by_round": by_round}  # fmt: skip


def determined_shares(rounds, q: float, u: float) -> np.ndarray:
    """``WorkloadParams.determined_share`` for an array of rounds: 1 - (1 - q) u^r."""
    r = np.maximum(np.asarray(rounds, dtype=np.float64), 0.0)
    if q == 0.0 or u == 1.0:
        return np.full(r.shape, float(q))
    return 1.0 - (1.0 - q) * u ** r


def round_factors(rounds, decay: float, steps_median: float) -> np.ndarray:
    """``WorkloadParams.round_factor`` for an array of rounds."""
    r = np.maximum(np.asarray(rounds, dtype=np.float64), 0.0)
    if decay >= 1.0:
        return np.ones_like(r)
    n = max(1, round(steps_median))
    return n * (1.0 - decay) / (1.0 - decay ** n) * decay ** r


def simulated_patterns(params: WorkloadParams, m: int, r: int, n: int = 2000, seed: int = 0) -> dict[tuple, float]:
    """The law of the identical-step pattern (sorted sizes of the sets of identical
    steps) of m siblings of round r in the sim: one block with probability
    ``identical_step_rate`` (a determined step), else drawn as the sim draws tokens, on n
    sampled groups: at each position every member goes on with a content token from the
    head or body Zipf law, or stops with the step-length hazard (EOS versus delimiter by
    the steps law's hazard at r completed steps); members stay one block while they draw
    the same tokens. Its own seeded generator: the same law on every call."""
    rng = np.random.default_rng([seed, m, r])
    vc = params.content_vocab
    ranks = np.arange(1, vc + 1, dtype=np.float64)
    cdf = []
    for overlap in params.position_overlaps():
        w = ranks ** -zipf_exponent(vc, overlap)
        cdf.append(np.cumsum(w / w.sum()))
    stop = lognormal_hazard(params.step_len_median, params.step_len_sigma, params.max_step_len)
    e = lognormal_hazard(params.steps_median, params.steps_sigma, 256)[min(r, 255)]
    # A share sibling_length_share of groups end together at a length drawn for the group.
    together, length = np.zeros(n, dtype=bool), np.zeros(n)
    if params.sibling_length_share > 0.0:  # (no draws without it: the patterns of the hazard alone)
        together = rng.random(n) < params.sibling_length_share
        length = params.step_length_at(rng.random(n))
    block = np.zeros((n, m), dtype=np.uint64)
    alive = np.ones((n, m), dtype=bool)
    for t in range(params.max_step_len):
        rows, cols = np.nonzero(alive)
        if not len(rows):
            break
        k = len(rows)
        ends = np.where(together[rows], t >= length[rows] - 1, rng.random(k) < stop[t]) | (t == params.max_step_len - 1)
        law = min(t, len(cdf) - 1)
        content = np.minimum(np.searchsorted(cdf[law], rng.random(k), side="right"), vc - 1)
        tok = np.where(ends, np.where(rng.random(k) < e, vc, vc + 1), content).astype(np.uint64)
        with np.errstate(over="ignore"):
            block[rows, cols] = block[rows, cols] * np.uint64(0x9E3779B97F4A7C15) + tok + np.uint64(1)
        alive[rows[ends], cols[ends]] = False
    law: dict[tuple, float] = {}
    q = params.identical_step_rate
    for row in np.sort(block, axis=1):
        sizes = np.diff(np.flatnonzero(np.r_[True, row[1:] != row[:-1], True]))
        pat = tuple(sorted(sizes.tolist(), reverse=True))
        law[pat] = law.get(pat, 0.0) + (1.0 - q) / n
    law[(m,)] = law.get((m,), 0.0) + q
    return law


def _block_law(law: dict[tuple, float], m: int) -> dict[int, np.ndarray]:
    """For a law of identical-step patterns of m siblings: by number of distinct steps k,
    N[L, j] = sum over patterns with k blocks of P(pattern) x (ways to pick j of its
    blocks holding L children in all)."""
    out: dict[int, np.ndarray] = {}
    for pat, weight in law.items():
        n = np.zeros((m + 1, len(pat) + 1))
        n[0, 0] = 1.0
        for size in pat:  # each block is lost (size more children, one more block) or not
            grown = n.copy()
            grown[size:, 1:] += n[: m + 1 - size, :-1]
            n = grown
        out.setdefault(len(pat), np.zeros_like(n))
        out[len(pat)] += weight * n
    return out


def empirical_patterns(groups: pd.DataFrame) -> dict[int, dict[tuple, float]]:
    """The traces' law of identical-step patterns by group size."""
    return {m: (sub["blocks"].value_counts(normalize=True)).to_dict() for m, sub in groups.groupby("m")}


def determined_factors(q: float, f_d: float) -> tuple[float, float]:
    """The hazard multipliers (determined step, any other step) the sim applies
    (``SyntheticWorkload._determined_factor``): f_d and 1 (1 and 1 when no step is
    determined or f_d is 1)."""
    if q <= 0.0 or f_d == 1.0:
        return 1.0, 1.0
    return f_d, 1.0


def error_law_fit(groups: pd.DataFrame, steps_median: float, patterns=None, determined: float | None = None,
                  grid: int = 96, determined_decay: float = 1.0, problem_step: bool = True) -> dict:  # fmt: skip
    """Maximum likelihood of (difficulty mean, concentration, error_round_decay,
    sibling_error_correlation[, determined_hazard_factor]) from the lost children of
    on-track parents' sibling groups.

    For a group of m children in round r of a problem of difficulty d, h = min(1, d x
    round_factor(r)); with probability h the parent's shared uniform is below h, so each
    of its distinct steps is lost with probability rho + (1 - rho) h, else (1 - rho) h;
    identical siblings share a step's fate. d ~ Beta is integrated per problem (over every
    search of it in the traces) on ``grid``
    quantiles. The optimum is the best of two L-BFGS-B starts (independent, flat;
    correlated, decaying). The concentration is bounded to [0.05, 1e4]: at 1e4 the
    traces show no spread of difficulty across problems.

    determined None: the identical-step pattern is drawn from ``patterns(m, r)`` (a law:
    pattern -> probability; None: the traces' law for groups of size m), never the
    group's own pattern, and every step has hazard h (the sim without
    determined_hazard_factor draws text and fate apart). determined = q (the fitted
    identical_step_rate) and determined_decay = u (the fitted undetermined_round_decay,
    both from ``identical_step_fit``): a group of round r (its children's round) is
    determined with probability q_r = 1 - (1 - q) u^r (``determined_shares``, the sim's
    ``WorkloadParams.determined_share``). ``patterns(m, r)`` is the law of the steps the
    sim does not determine (``simulated_patterns`` with q = 0) and the likelihood is that
    of the group's lost count and whether its members all wrote the identical step, as
    the sim draws both: with probability q_r the step is determined (one block, all
    identical) and its hazard is h f_d; else the pattern is drawn from the law and the
    hazard is h (``determined_factors``; capped at 1 after the multiplier, as the sim
    compares it with a uniform). An all-identical group is thus read
    as determined unless chance made it so (the law's one-block mass, ~2e-4 on the
    testbed); a single child's group tells nothing apart (its hazard averages to h). The
    finer pattern of the other groups is still drawn from the law, not read. f_d is fitted
    on [1e-3, 5] from a start at 1; fixed to 1 when q = 0 or no group of >= 2 members is
    all identical. The problem's shift of its determined share
    (``determined_problem_spread``) is left out: given whether a group is all identical,
    its lost count's law does not depend on it (``identical_step_fit`` fits it).

    problem_step: also fit sigma, the sim's ``problem_step_correlation``: a step takes the
    problem's draw U for its round (shared by every group of the problem in that round, in
    every search) with probability sigma, else its parent's (rho), else its own. U is
    integrated out exactly per (problem, round): the indicators [U < h] change only at the
    round's two hazards (determined and other steps), so three states weighted by the
    widths of [0, lo), [lo, hi), [hi, 1]. Several independent searches of each problem tell
    sigma (the same round fails in every search) from difficulty (the problem fails at
    every round) and rho (one parent's children fail together)."""
    g = groups[groups["parent_on_track"]].reset_index(drop=True)
    # d is a property of the problem: integrated once per problem over all its searches
    # (traces may hold several independent searches of each problem), so a problem hard
    # in every search reads as difficulty, a group failing together as correlation.
    problems, pidx = np.unique(g["problem_id"].astype(str).to_numpy(), return_inverse=True)
    rounds = np.unique(g["round"])
    ridx = np.searchsorted(rounds, g["round"].to_numpy())
    if patterns is None:
        by_size = empirical_patterns(g)
        patterns = lambda m, r: by_size[m]  # noqa: E731
    q = 0.0 if determined is None else float(determined)
    q_r = determined_shares(rounds, q, determined_decay if determined is not None else 1.0)  # per round index
    fit_fd = determined is not None and 0.0 < q < 1.0 and bool((g["identical"] & (g["m"] >= 2)).any())
    cells = []  # (rows of the groups of size m in round index ri, lost counts, all identical, m, ri, N one block,
    #            N the others, j, k - j): the block law (``_block_law``) by column
    for (m, ri), sub in g.assign(_ri=ridx).groupby(["m", "_ri"]):
        law = _block_law(patterns(int(m), int(rounds[ri])), int(m))
        # Every k's columns side by side: N[L, (k, j)], with j and k per column; the one-block
        # columns (all identical) apart from the others.
        ks = sorted(law)
        n_all = np.concatenate([law[k] for k in ks], axis=1)
        j = np.concatenate([np.arange(k + 1) for k in ks])[:, None].astype(float)
        k_of = np.concatenate([np.full(k + 1, k) for k in ks])[:, None].astype(float)
        one = np.where(k_of.T == 1, n_all, 0.0)
        cells.append((sub.index.to_numpy(), sub["lost"].to_numpy(), sub["identical"].to_numpy(dtype=bool), int(m),
                      int(ri), one, n_all - one, j, k_of - j))  # fmt: skip
    u = (np.arange(grid) + 0.5) / grid

    # Each group's (problem, round) cell: the paths of a problem meeting one round share
    # the problem's draw for it (problem_step_correlation).
    cell_keys = pidx.astype(np.int64) * (len(rounds) + 1) + ridx
    cells_u, cidx = np.unique(cell_keys, return_inverse=True)
    corder = np.argsort(cidx, kind="stable")
    cstarts = np.flatnonzero(np.r_[True, np.diff(cidx[corder]) != 0])
    cell_round = (cells_u % (len(rounds) + 1)).astype(int)
    cell_problem = (cells_u // (len(rounds) + 1)).astype(int)  # sorted: cells of a problem are adjacent
    pstarts = np.flatnonzero(np.r_[True, np.diff(cell_problem) != 0])
    # The problem's draw U for a round sits below both step hazards (state 0), between them
    # (1) or above both (2): the indicators [U < h] of the other and the determined steps.
    states = ((1.0, 1.0), (None, None), (0.0, 0.0))

    def group_logp(h: np.ndarray, rho: float, f_d: float, sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """log P(lost children[, all identical]) of every group at each difficulty and
        state of the problem's draw [groups, grid, 3], and the two step hazards [rounds, grid]."""
        out = np.empty((len(g), grid, 3))
        f_det, f_other = np.array([determined_factors(float(x), f_d) for x in q_r]).T  # [rounds] each
        h_det = np.clip(h * f_det[:, None], 1e-12, 1.0 - 1e-12)
        h_other = np.clip(h * f_other[:, None], 1e-12, 1.0 - 1e-12)
        for rows, lost, ident, m, ri, one, many, j, kj in cells:
            hr, hd = h_other[ri], h_det[ri]
            for si, (s_o, s_d) in enumerate(states):
                if s_o is None:  # between: only the step with the higher hazard is below U
                    s_o, s_d = (hr > hd).astype(float), (hd > hr).astype(float)
                # a step takes the problem's draw (sigma), else its parent's (rho), else its own
                shared = sigma * s_o + (1.0 - sigma) * (rho + (1.0 - rho) * hr)  # the parent's draw below h
                own = sigma * s_o + (1.0 - sigma) * (1.0 - rho) * hr  # or not
                # P(j of the k distinct steps lost) [columns, grid]
                b = hr * shared ** j * (1.0 - shared) ** kj + (1.0 - hr) * own ** j * (1.0 - own) ** kj
                if determined is None:
                    prob = (one + many) @ b
                    out[rows, :, si] = np.log(np.maximum(prob[lost], 1e-300))
                    continue
                qr = q_r[ri]
                p_det = sigma * s_d + (1.0 - sigma) * hd
                same = (1.0 - qr) * (one @ b)  # all identical by chance
                same[0] += qr * (1.0 - p_det)  # a determined step: one block, lost with probability h f_d
                same[m] += qr * p_det
                other = (1.0 - qr) * (many @ b)
                prob = np.where(ident[:, None], same[lost], other[lost])
                out[rows, :, si] = np.log(np.maximum(prob, 1e-300))
        return out, h_det, h_other

    def nll(theta: np.ndarray) -> float:
        mean, log_c, decay, rho = theta[:4]
        f_d = theta[4] if fit_fd else 1.0
        sigma = theta[-1] if problem_step else 0.0
        c = math.exp(log_c)
        d = special.betaincinv(c * mean, c * (1.0 - mean), u)
        h = d[None, :] * round_factors(rounds, decay, steps_median)[:, None]  # clipped after the factors, as the sim
        logp, h_det, h_other = group_logp(h, rho, f_d, sigma)
        per_cell = np.add.reduceat(logp[corder], cstarts, axis=0)  # [cells, grid, 3]
        lo = np.minimum(h_det, h_other)[cell_round]  # [cells, grid]
        hi = np.maximum(h_det, h_other)[cell_round]
        weights = np.log(np.maximum(np.stack([lo, hi - lo, 1.0 - hi], axis=-1), 1e-300))
        cell = special.logsumexp(per_cell + weights, axis=-1)  # U integrated out per (problem, round)
        per = np.add.reduceat(cell, pstarts, axis=0)  # [problems, grid]
        return -float((special.logsumexp(per, axis=1) - math.log(grid)).sum())

    m0 = float(np.clip(g["lost"].sum() / max(g["m"].sum(), 1), 0.02, 0.9))
    bounds = [(1e-3, 0.999), (math.log(0.05), math.log(1e4)), (0.05, 1.0), (0.0, 0.999)]
    x0s = [[m0, math.log(2.0), 1.0, 0.0], [m0, math.log(2.0), 0.7, 0.5]]
    if fit_fd:
        bounds.append((1e-3, 5.0))
        x0s = [x + [1.0] for x in x0s]
    if problem_step:
        bounds.append((0.0, 0.999))
        x0s = [x + [0.0] for x in x0s] + [x + [0.5] for x in x0s]
    best = None
    for x0 in x0s:
        res = optimize.minimize(nll, x0, method="L-BFGS-B", bounds=bounds)
        if best is None or res.fun < best.fun:
            best = res
    mean, log_c, decay, rho = best.x[:4]
    f_d = float(best.x[4]) if fit_fd else 1.0
    sigma = float(best.x[-1]) if problem_step else 0.0
    return {"difficulty_mean": float(mean), "difficulty_concentration": math.exp(log_c), "error_round_decay":
            float(decay), "sibling_error_correlation": float(rho), "determined_hazard_factor": f_d,
            "problem_step_correlation": sigma,
            "nll": float(best.fun), "groups": len(g), "problems": len(problems)}  # fmt: skip


def pooled_decay_fit(lost, tried) -> float:
    """Binomial MLE of g in (0, 1] for per-round counts with hazard h0 g^r (h0 free):
    the pooled statistic, confounded by which problems reach later rounds."""
    lost, tried = np.asarray(lost, dtype=float), np.asarray(tried, dtype=float)
    r = np.arange(len(lost), dtype=float)

    def nll(theta):
        h = np.clip(theta[0] * theta[1] ** r, 1e-12, 1 - 1e-12)
        return -float((lost * np.log(h) + (tried - lost) * np.log1p(-h)).sum())

    h0 = float(np.clip(lost.sum() / max(tried.sum(), 1), 1e-3, 0.99))
    res = optimize.minimize(nll, [h0, 0.9], method="L-BFGS-B", bounds=[(1e-6, 1.0), (1e-3, 1.0)])
    return float(res.x[1])


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
    """(P(a child of an on-track parent is lost), P(it is lost | a sibling is lost)) over the
    ordered pairs of siblings after round 0 (siblings: one parent key): pooled, so
    identical siblings and the spread of the hazard across problems and rounds raise the
    second as the sim's sibling_error_correlation does (a check; ``error_law_fit`` tells
    them apart)."""
    tried = members[members["parent_on_track"] & members["parent"].notna()]
    pairs = lost_pairs = 0
    for _, g in tried.groupby("group"):
        lost = int((~g["on_track"]).sum())
        pairs += lost * (len(g) - 1)  # ordered pairs (a lost, b another sibling)
        lost_pairs += lost * (lost - 1)
    p = float((~tried["on_track"]).mean()) if len(tried) else float("nan")
    return p, lost_pairs / pairs if pairs else float("nan")


def determined_loss_rates(groups: pd.DataFrame) -> dict:
    """Losses of on-track parents' sibling groups of >= 2 members, apart for the groups
    whose members all wrote the identical step (read as determined) and the others:
    {part: {groups, members, lost, loss_rate (lost / members), groups_losing_any}}."""
    g = groups[groups["parent_on_track"] & (groups["m"] >= 2)]
    out = {}
    for part, sub in (("determined", g[g["identical"]]), ("other", g[~g["identical"]])):
        members = int(sub["m"].sum())
        out[part] = {"groups": len(sub), "members": members, "lost": int(sub["lost"].sum()),
                     "loss_rate": _r(sub["lost"].sum() / members, 4) if members else float("nan"),
                     "groups_losing_any": _r((sub["lost"] > 0).mean(), 4) if len(sub) else float("nan")}  # fmt: skip
    return out


def beta_fit(scores) -> tuple[float, float]:
    x = np.clip(np.asarray(scores, dtype=float), EPS, 1 - EPS)
    a, b, _, _ = stats.beta.fit(x, floc=0, fscale=1)
    return float(a), float(b)


def within_round_auc(members: pd.DataFrame) -> float:
    """P(an on-track step outscores an off-track one of the same request and round) over
    distinct steps (ties half): how well the PRM ranks what the search chooses between."""
    steps = members.assign(_step=members["tokens"].map(tuple)).drop_duplicates(["request_id", "parent", "_step"])
    win = total = 0.0
    for _, g in steps.groupby(["request_id", "round"]):
        on, off = g.loc[g["on_track"], "score"].to_numpy(), g.loc[~g["on_track"], "score"].to_numpy()
        if len(on) and len(off):
            diff = on[:, None] - off[None, :]
            win += (diff > 0).sum() + 0.5 * (diff == 0).sum()
            total += diff.size
    return win / total if total else float("nan")


def score_equality(members: pd.DataFrame, on_track: bool = True, decimals: int = 4) -> float:
    """P(two on-track (or two off-track) members of one problem's round, in any of its
    searches, have the same score to ``decimals``): 1 for on-track members when every
    right step of a round is one path the PRM scores once (the testbed's arithmetic),
    lower the more paths are scored apart."""
    on = members[members["on_track"].astype(bool) == on_track]
    pairs = equal = 0
    for _, g in on.assign(_s=on["score"].round(decimals)).groupby(["problem_id", "round"]):
        n = len(g)
        pairs += n * (n - 1) // 2
        equal += int(sum(k * (k - 1) // 2 for k in g["_s"].value_counts()))
    return equal / pairs if pairs else float("nan")


def shared_score_share(equality: float, chance_equality: float) -> float:
    """The sim's ``round_score_share`` psi from the traces' on-track score equality e
    (``score_equality``) and the sim's own at psi = 0, e0 (right paths that are one path
    by their text alone, a determined step): a pair is equal when both share the round's
    score (psi^2) or else by e0, so e = psi^2 + (1 - psi^2) e0."""
    if not chance_equality < 1.0:
        return 0.0
    return float(math.sqrt(min(1.0, max(0.0, (equality - chance_equality) / (1.0 - chance_equality)))))


def wrong_score_overlap(equality: float, chance_equality: float, share: float, vocab: int = 128) -> float:
    """The sim's ``wrong_score_overlap`` w from the traces' off-track score equality e, the
    sim's at psi = 0, e0, and psi (``shared_score_share``): two off-track steps that both
    take their round's wrong scores (psi^2) are equal with probability w, so e = psi^2 w +
    (1 - psi^2) e0. Clipped into the Zipf law's range (1/vocab, 0.999]; 0.5 (unused) when
    psi is 0."""
    if share <= 0.0:
        return 0.5
    w = (equality - (1.0 - share * share) * chance_equality) / (share * share)
    return float(min(0.999, max(1.0 / vocab + 1e-3, w)))


def off_track_correct_share(members: pd.DataFrame, answers: dict[str, str]) -> float:
    """The share of off-track finished paths (one per request and key) whose answer is the
    reference: the sim's ``off_track_correct_share``."""
    done = members[members["terminal"] & ~members["on_track"]].drop_duplicates(["request_id", "key"])
    if not len(done):
        return 0.0
    right = [str(a) == answers[pid] for a, pid in zip(done["answer"], done["problem_id"])]
    return float(np.mean(right))


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


def fit(members: pd.DataFrame, prompt_tokens, answers: dict[str, str], text_mechanisms: bool = False) -> FittedWorkload:
    """The testbed workload from its traces. text_mechanisms: also write the siblings'
    per-position overlap and shared lengths (``token_overlap_by_position``,
    ``sibling_length_share``; always measured, in the checks). They make the sim's
    siblings write identical steps as often as the testbed's do, which deduplication's
    savings depend on; but the sim draws a step's fate apart from its text, so the steps
    siblings share by chance err like any, where the testbed's shared steps are its right
    ones: with them, the fit's own accuracy check (``scaling_check``) falls below the
    testbed's at beam 2. Off until text and fate are coupled."""
    step_med, step_sig = discrete_lognormal_fit(members["n_tokens"][members["n_tokens"] > 0])
    finished = members[members["terminal"]]
    steps = steps_problem_fit(finished["problem_id"], finished["round"] + 1)
    steps_med, steps_sig = steps["median"], steps["sigma"]
    hist = members.assign(_hist=history_groups(members))
    counts = collision_counts(hist, group="_hist")
    head, body, share = sibling_collision(hist, group="_hist", skip_identical=True, counts=counts)
    head_all, body_all, _ = sibling_collision(hist, group="_hist", counts=counts)
    shape = {"token_overlap": _r(min(body, MAX_OVERLAP), 4), "head_overlap": _r(min(head, MAX_OVERLAP), 4),
             "head_tokens": HEAD_TOKENS, "step_len_median": _r(step_med, 3), "step_len_sigma": _r(step_sig, 4),
             "steps_median": _r(steps_med, 3), "steps_sigma": _r(steps_sig, 4),
             "steps_problem_sigma": _r(steps["problem_sigma"], 4)}  # fmt: skip
    profile = [_r(v, 4) for v in position_collision(counts)]
    lengths = sibling_length_fit(counts, WorkloadParams.from_config({**shape, "token_overlap_by_position": profile}))
    if text_mechanisms:
        shape.update(token_overlap_by_position=profile, sibling_length_share=_r(lengths["share"], 4))
    groups = sibling_groups(members)
    ident = identical_step_fit(groups, WorkloadParams.from_config(shape))
    q, u = _r(ident["q"], 4), _r(ident["u"], 4)
    chance = WorkloadParams.from_config(shape)  # the text law of the steps the sim does not determine
    law = error_law_fit(groups, steps_med, lambda m, r: simulated_patterns(chance, m, r), determined=q,
                        determined_decay=u)  # fmt: skip
    f_d = _r(law["determined_hazard_factor"], 4)
    law_emp = error_law_fit(groups, steps_med)
    d_mean, d_conc, per = hazard_fit(members)
    on, off = members[members["on_track"]], members[~members["on_track"]]
    on_one, off_one = float((on["score"] >= 1.0).mean()), float((off["score"] >= 1.0).mean())
    on_beta = beta_fit(on.loc[on["score"] < 1.0, "score"])
    off_beta = beta_fit(off.loc[off["score"] < 1.0, "score"])
    p_mean = float(np.mean(prompt_tokens))
    p_sig = float(np.log(np.asarray(prompt_tokens, dtype=float)).std()) or 0.01
    by_level = per.groupby("level")[["lost", "tried"]].sum()
    p_lost, p_lost_sib = sibling_loss_correlation(members)
    tried = members[members["parent_on_track"]]
    by_round = tried.groupby("round")["on_track"].agg(tried="size", lost=lambda x: int((~x).sum()))
    by_round = by_round.reindex(range(int(by_round.index.max()) + 1), fill_value=0)
    synthetic = {
        **shape, "error_rate": 1.0,
        "exact_one_share": _r(on_one, 4),
        "off_track_one_factor": _r(off_one / on_one, 4) if on_one > 0 else 0.0,
        "on_beta": [_r(v, 4) for v in on_beta], "off_beta": [_r(v, 4) for v in off_beta],
        "wrong_answers": wrong_answer_count(members, answers),
        "identical_step_rate": q,
        "undetermined_round_decay": u,
        "determined_problem_spread": _r(ident["spread"], 4),
        "determined_hazard_factor": f_d,
        "sibling_error_correlation": _r(law["sibling_error_correlation"], 4),
        "error_round_decay": _r(law["error_round_decay"], 4),
        "problem_step_correlation": _r(law["problem_step_correlation"], 4),
        "off_track_correct_share": _r(off_track_correct_share(members, answers), 4),
    }  # fmt: skip
    checks = {
        "members": len(members), "problems": int(members["problem_id"].nunique()), "finished_paths": len(finished),
        "steps_fit": {k: v if isinstance(v, (int, str)) else _r(v, 4) for k, v in steps.items()},
        "sibling_token_share": _r(share, 4), "on_track_steps": len(on), "off_track_steps": len(off),
        "overlap_all_groups": {"token_overlap": _r(body_all, 4), "head_overlap": _r(head_all, 4)},
        "sibling_lengths": {k: v if isinstance(v, int) else _r(v, 4) for k, v in lengths.items()},
        "token_overlap_by_position": profile,
        "exact_one_on_track": on_one, "exact_one_off_track": off_one,
        "within_round_auc": _r(within_round_auc(members), 4),
        "on_track_score_equality": _r(score_equality(members), 4),
        "off_track_score_equality": _r(score_equality(members, on_track=False), 4),
        "on_track_score_mean": float(on["score"].mean()), "off_track_score_mean": float(off["score"].mean()),
        "step_hazard_by_level": {int(k): _r(r["lost"] / r["tried"], 4) for k, r in by_level.iterrows()},
        "step_hazard_overall": _r(float(per["lost"].sum() / per["tried"].sum()), 4),
        "step_hazard_by_round": {int(k): _r(r["lost"] / r["tried"], 4) for k, r in by_round.iterrows()
                                 if r["tried"]},
        "step_counts_by_round": {int(k): [int(r["lost"]), int(r["tried"])] for k, r in by_round.iterrows()},
        "error_round_decay_pooled": _r(pooled_decay_fit(by_round["lost"], by_round["tried"]), 4),
        "p_lost_after_round0": _r(p_lost, 4), "p_lost_given_sibling_lost": _r(p_lost_sib, 4),
        "sibling_error_correlation_pooled": _r(math.sqrt(max(0.0, (p_lost_sib - p_lost) / (1 - p_lost)))
                                               if p_lost < 1 and p_lost_sib == p_lost_sib else 0.0, 4),
        "error_law_fit": {k: v if isinstance(v, int) else _r(v, 4) for k, v in law.items()},
        "determined_hazard_factors": dict(zip(("determined", "other"), (_r(v, 4) for v in
                                                                         determined_factors(q, f_d)))),
        "loss_by_determined": determined_loss_rates(groups),
        "error_law_fit_traces_patterns": {k: v if isinstance(v, int) else _r(v, 4) for k, v in law_emp.items()},
        "difficulty_betabinomial": {"difficulty_mean": _r(d_mean, 4), "difficulty_concentration": _r(d_conc, 4)},
        "identical_groups": ident["groups"], "identical_share_observed": _r(ident["observed"], 4),
        "identical_share_chance": _r(ident["chance"], 6),
        "identical_share_by_round": {r: {k: v if isinstance(v, int) else _r(v, 4) for k, v in row.items()}
                                     for r, row in ident["by_round"].items()},
        "determined_hazard_factors_by_round": {
            r: dict(zip(("determined", "other"), (_r(v, 4) for v in determined_factors(row["determined_share"], f_d))))
            for r, row in ident["by_round"].items()},
        "identical_chance_overlap_power": _r(ident["chance_overlap_power"], 4),
        "steps_by_level": {int(k): float(g["round"].mean() + 1) for k, g in finished.groupby("level")},
    }  # fmt: skip
    return FittedWorkload(
        synthetic=synthetic,
        problems={"difficulty_concentration": _r(law["difficulty_concentration"], 4),
                  "prompt_tokens_sigma": _r(p_sig, 4)},
        dataset_sim={"difficulty_mean": _r(law["difficulty_mean"], 4), "prompt_tokens_mean": _r(p_mean, 2)},
        checks=checks,
    )
