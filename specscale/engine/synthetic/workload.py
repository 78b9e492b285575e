"""The synthetic workload: token distributions, PRM rewards, latent correctness, answers.

Every quantity is a pure function of the token history (through its rolling hash), so
identical histories give identical distributions and scores: exactly the property
deduplication and the equivalence contract rely on. Distributions are specified at the
sampling temperature: logits are returned as T*log p, so the shared sampler's
softmax(logits / T) reproduces p.

The model (each knob in `WorkloadParams`, documented there):
- content tokens follow a Zipf law over a per-history pseudo-permutation of the
  content vocabulary; its exponent is solved so that two siblings draw the same token
  with probability `token_overlap` (sum of p^2), higher for the first `head_tokens`
  tokens of a step (formatting like "## Step k:"), as real steps begin alike;
- a step ends with the delimiter or EOS with the discrete hazard of a log-normal step
  length (long tail: stragglers among siblings); EOS versus delimiter follows the
  hazard of a log-normal number of steps;
- a share `identical_step_rate` of steps is *determined*: every sibling drawing it from
  the same history writes the same text (one token carries all the mass, the length is
  fixed by the history), as low-entropy steps of a real model do (the closing sentence,
  a restated formula); this is what lets deduplication save PRM work as well as forwards;
  the share may vary across problems (``determined_problem_spread``: a routine problem
  is routine throughout) and determined steps may err less (``determined_hazard_factor``);
- each path has a latent "on track" bit, lost at a step with probability growing with
  problem difficulty, falling with depth (`error_round_decay`), correlated between
  siblings through their parent (`sibling_error_correlation`: a parent that leads its
  children astray leads several of them) and between every path of a problem at one
  round (`problem_step_correlation`: a hard step is hard in every attempt); PRM rewards are Beta draws correlated with it,
  with a configurable share of exact 1.0; the answer at EOS is the reference when on
  track, else (but for a share `off_track_correct_share` of off-track paths, whose
  error did not change the result) one of a few wrong answers (so wrong answers can
  also collect votes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, Mapping

import numpy as np
import torch
from scipy.special import betaincinv, expit, logit, ndtr, ndtri

from specscale.hashing import combine, combine_np, mix64, to_unit, unit_np

EOS = 0
DELIMITER = 1
N_SPECIAL = 2


@dataclass(frozen=True)
class WorkloadParams:
    content_vocab: int = 128  # power of two: the pseudo-permutation is an affine map mod 2^k
    # P(two siblings drawing from the same history pick the same content token). Once
    # their histories differ they never share again, so the measured share of common
    # sibling tokens (`measure_sibling_overlap`) is lower: 0.8 gives ~29%, 0.9 ~42%,
    # 0.93 ~50%: 0.75-0.93 spans
    # the 25-50% the paper reports at T=0.8.
    token_overlap: float = 0.9
    head_overlap: float = 0.97  # same, for the first head_tokens tokens of a step
    head_tokens: int = 3
    # The overlap position by position from a step's start, where siblings agree more at
    # some positions than others (the testbed's "a+b=" is copied, its result digits are
    # where siblings part): position t < len draws with overlap[t], later ones with
    # token_overlap; head_overlap and head_tokens apply only without it. (): no profile.
    token_overlap_by_position: tuple[float, ...] = ()
    step_len_median: float = 40.0  # tokens per step (incl. the delimiter), log-normal
    step_len_sigma: float = 0.8  # log-normal shape: larger = longer straggler tail
    # Siblings end their steps together: a share of the steps siblings write differently
    # take their length from where the step began (the step-length law's quantile at a
    # draw of the start, as determined steps do), so every sibling's step has it; the rest
    # end by the length law's hazard, each on its own. The testbed's siblings write steps
    # of one length in 78% of groups that differ (the length is the arithmetic's). 0:
    # every sibling's length its own.
    sibling_length_share: float = 0.0
    steps_median: float = 7.0  # steps to EOS, log-normal
    steps_sigma: float = 0.45  # the spread of one problem's paths around its own median
    # A solution's length is a property of its problem (the testbed's level-k problems take
    # k + 1 steps in every path): log(a problem's median steps) ~ N(log steps_median,
    # steps_problem_sigma^2), drawn from the problem's key. 0: every problem the same
    # median, the paths' spread is all there is.
    steps_problem_sigma: float = 0.0
    error_rate: float = 0.5  # P(lose track at a step) = error_rate * difficulty
    exact_one_share: float = 0.35  # share of exact 1.0 rewards on on-track steps (Qwen PRM high, Llama low)
    off_track_one_factor: float = 0.15  # off-track steps get exact 1.0 this much less often
    on_beta: tuple[float, float] = (4.0, 2.0)  # reward ~ Beta(a, b) on track (mean 0.67)
    off_beta: tuple[float, float] = (3.0, 3.0)  # reward ~ Beta(a, b) off track (mean 0.5): a noisy PRM
    wrong_answers: int = 3  # distinct wrong answers per problem
    max_step_len: int = 4096
    # Share of steps every sibling writes identically (a determined step: one token holds
    # all the mass at each position, the length is fixed by the history). 0: siblings
    # share a whole step only by chance (token_overlap ** length).
    identical_step_rate: float = 0.0
    # Later steps are more often determined (the path has settled): the share of steps
    # siblings write differently shrinks by this factor per round, so the determined share
    # at round r is 1 - (1 - identical_step_rate) * decay^r. 1.0: the same at every round.
    undetermined_round_decay: float = 1.0
    # A determined step's hazard relative to any other step's: a step the model is sure of
    # (every sibling writes it) is rarely the one that goes wrong. The other steps keep
    # the round's hazard, so a problem or round with more determined steps loses fewer
    # paths (the testbed: undetermined steps lose track at a rate flat across rounds,
    # determined ones almost never). 1.0: determined steps err as often as any.
    determined_hazard_factor: float = 1.0
    # A problem the model finds routine is routine throughout: the determined share varies
    # across problems, logit(share of problem p at round r) = logit(determined_share(r)) +
    # determined_problem_spread * z_p, z_p a standard normal fixed by the problem (the
    # same in every search and seed). With determined steps rarely erring, this is a
    # problem's persistent difficulty. (On the testbed it is small, 0.47: most of the
    # contrast in identical sibling groups between problems every search covers and
    # problems none covers is in the rounds they reach.) 0: the same share for every
    # problem.
    determined_problem_spread: float = 0.0
    # Siblings' errors are correlated through their parent: a child draws its "lose track"
    # uniform from its parent's shared draw with this probability, else its own, so
    # P(a sibling lost | another lost) = rho^2 + (1 - rho^2) * hazard. 0: independent.
    sibling_error_correlation: float = 0.0
    # The hazard of losing track at round r is error_rate * difficulty * f0 * decay^r:
    # errors come early in a solution. f0 keeps error_rate * difficulty the mean hazard
    # over the first steps_median rounds (``round_factors``). 1.0: the same at every depth.
    error_round_decay: float = 1.0
    # An off-track path can still end at the reference answer: a wrong step that does not
    # change the result (the testbed writes "0+0=0" for "0-0=0"; a flawed MATH step can
    # land on the right value). Each off-track finished path does so with this
    # probability. 0: losing track always means a wrong answer.
    off_track_correct_share: float = 0.0
    # A step hard for the model is hard in every attempt: a share of steps draw their
    # "lose track" uniform from one draw of the problem at that round, shared by every path
    # of the problem (any beam, any seed) that reaches the round, so either all of them
    # fail it or none does, and a wider search cannot route around it. The testbed's
    # searches agree on which (problem, round) loses paths (loss shares correlate ~0.9
    # across independent searches). 0: only difficulty and the parent correlate fates.
    problem_step_correlation: float = 0.0
    # The PRM scores a share of steps by their own correctness and the rest by their
    # round's: a step of a round where the problem's hard step fails (its shared draw
    # below the round's hazard) looks off track, any other on track. So the PRM ranks the
    # steps of one round worse than its pooled separation of right and wrong steps says:
    # the testbed's PRM puts a right step above a wrong one of the same round 67% of the
    # time, 82% pooled over rounds. 1: every step is scored by its own correctness.
    prm_step_sensitivity: float = 1.0
    # A step is often one of few texts: every on-track path of a problem's round writes the
    # same right step (the testbed's arithmetic has one right result) and wrong paths
    # repeat a few wrong ones, so the PRM gives each text one score. A share of steps draw
    # their reward from the problem's round (in every search): an on-track step the
    # round's right score, an off-track one one of the round's wrong scores, picked by a
    # Zipf law whose collision probability is ``wrong_score_overlap``; the rest draw
    # from their own history. The search then picks among few scores: it cannot take the
    # luckiest of several right paths, nor meet as many wrong draws. 0: every step scored
    # from its own history.
    round_score_share: float = 0.0
    wrong_score_overlap: float = 0.5

    def __post_init__(self) -> None:
        if self.content_vocab < 4 or self.content_vocab & (self.content_vocab - 1):
            raise ValueError("content_vocab must be a power of two >= 4")
        for name in ("token_overlap", "head_overlap", "wrong_score_overlap"):
            v = getattr(self, name)
            if not 1.0 / self.content_vocab < v < 1.0:
                raise ValueError(f"{name} must lie in (1/content_vocab, 1), got {v}")
        if any(not 1.0 / self.content_vocab < v < 1.0 for v in self.token_overlap_by_position):
            raise ValueError(f"token_overlap_by_position must lie in (1/content_vocab, 1), got "
                             f"{list(self.token_overlap_by_position)}")
        if not 0.0 <= self.exact_one_share <= 1.0:
            raise ValueError("exact_one_share must lie in [0, 1]")
        if not 0.0 <= self.determined_hazard_factor:
            raise ValueError(f"determined_hazard_factor must be >= 0, got {self.determined_hazard_factor}")
        for name in ("determined_problem_spread", "steps_problem_sigma"):
            if not 0.0 <= getattr(self, name):
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.undetermined_round_decay <= 1.0:
            raise ValueError(f"undetermined_round_decay must lie in (0, 1], got {self.undetermined_round_decay}")
        for name in ("identical_step_rate", "sibling_error_correlation", "off_track_correct_share",
                     "problem_step_correlation", "prm_step_sensitivity", "round_score_share",
                     "sibling_length_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.error_round_decay <= 1.0:
            raise ValueError(f"error_round_decay must lie in (0, 1], got {self.error_round_decay}")

    def step_length_at(self, u) -> np.ndarray:
        """The step-length law's quantile (tokens, the end token included) at uniforms u:
        the length a step takes from a draw when it does not end by the hazard."""
        z = ndtri(np.clip(np.asarray(u, dtype=np.float64), 1e-12, 1 - 1e-12))
        return np.clip(np.ceil(self.step_len_median * np.exp(self.step_len_sigma * z)), 1,
                       self.max_step_len).astype(np.int64)

    def step_length_pmf(self, max_len: int) -> np.ndarray:
        """P(a step is t + 1 tokens long) for t < max_len when it ends by the hazard
        (``lognormal_hazard``)."""
        stop = lognormal_hazard(self.step_len_median, self.step_len_sigma, max_len)
        return np.concatenate([[1.0], np.cumprod(1.0 - stop)[:-1]]) * stop

    def position_overlaps(self) -> list[float]:
        """The content overlap at positions 0, 1, ... of a step; the last entry holds for
        every later position."""
        if self.token_overlap_by_position:
            return [*self.token_overlap_by_position, self.token_overlap]
        return [self.head_overlap] * self.head_tokens + [self.token_overlap]

    def determined_share(self, r, z: Any = None) -> Any:
        """The share of determined steps at round r (scalar or array) of a problem whose
        normal draw is z (``problem_z``; None: the share without the problem's shift)."""
        q = self.identical_step_rate
        if q == 0.0 or self.undetermined_round_decay == 1.0:
            base = q if np.isscalar(r) else np.full(np.shape(r), q)
        else:
            base = 1.0 - (1.0 - q) * self.undetermined_round_decay ** np.maximum(r, 0)
        if z is None or self.determined_problem_spread == 0.0 or q == 0.0:
            return base
        with np.errstate(divide="ignore"):
            return expit(logit(base) + self.determined_problem_spread * np.asarray(z))

    @property
    def per_problem_text(self) -> bool:
        """Whether the token law depends on the problem (its determined share or its
        solution length)."""
        determined = self.identical_step_rate > 0.0 and self.determined_problem_spread > 0.0
        return determined or self.steps_problem_sigma > 0.0

    def round_factor(self, r: int) -> float:
        """The hazard's multiplier at round r: decay^r, normalised to mean 1 over the
        first round(steps_median) rounds (so error_rate keeps its meaning)."""
        g = self.error_round_decay
        if g == 1.0:
            return 1.0
        n = max(1, round(self.steps_median))
        return n * (1 - g) / (1 - g ** n) * g ** max(r, 0)

    @classmethod
    def from_config(cls, mapping: Mapping[str, Any] | None) -> "WorkloadParams":
        mapping = dict(mapping or {})
        names = {f.name for f in fields(cls)}
        unknown = set(mapping) - names
        if unknown:
            raise ValueError(f"unknown sim workload setting(s) {sorted(unknown)}; known: {sorted(names)}")
        for k in ("on_beta", "off_beta", "token_overlap_by_position"):
            if k in mapping:
                mapping[k] = tuple(mapping[k])
        return cls(**mapping)


@lru_cache(maxsize=64)
def zipf_exponent(vocab: int, overlap: float) -> float:
    """Exponent a with sum_r p_r^2 = overlap for p_r proportional to (r+1)^-a."""
    ranks = np.arange(1, vocab + 1, dtype=np.float64)

    def collision(a: float) -> float:
        p = ranks ** -a
        p /= p.sum()
        return float((p * p).sum())

    lo, hi = 0.0, 20.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if collision(mid) < overlap:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def lognormal_hazard(median: float, sigma: float, n: int) -> np.ndarray:
    """h[t] = P(L = t+1 | L > t) for L ~ LogNormal(ln median, sigma) discretised by ceil."""
    edges = np.arange(0, n + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        cdf = ndtr((np.log(np.maximum(edges, 1e-300)) - math.log(median)) / sigma)
    cdf[0] = 0.0
    surv = 1.0 - cdf[:-1]
    h = np.where(surv > 1e-12, (cdf[1:] - cdf[:-1]) / np.maximum(surv, 1e-300), 1.0)
    return np.clip(h, 0.0, 1.0)


class SyntheticWorkload:
    """Token logits, PRM rewards and answers as functions of the history."""

    def __init__(self, params: WorkloadParams, temperature: float) -> None:
        self.p = params
        self.temperature = temperature if temperature > 0 else 1.0
        vc = params.content_vocab
        self.vocab_size = vc + N_SPECIAL
        ranks = np.arange(1, vc + 1, dtype=np.float64)
        # One Zipf law per position of the profile then the rest ([head, body] without one).
        overlaps = params.position_overlaps() if params.token_overlap_by_position else [params.head_overlap,
                                                                                         params.token_overlap]
        self._logp = np.stack([np.log(w / w.sum()) for w in (ranks ** -zipf_exponent(vc, o) for o in overlaps)])
        self._stop = lognormal_hazard(params.step_len_median, params.step_len_sigma, params.max_step_len)
        self._eos = lognormal_hazard(params.steps_median, params.steps_sigma, 256)
        self._arange = np.arange(vc, dtype=np.int64)
        w = ranks ** -zipf_exponent(vc, params.wrong_score_overlap)  # which wrong step of a round
        self._wrong_cdf = np.cumsum(w / w.sum())[:-1]
        self._on_track: dict[int, bool] = {}
        self._reward: dict[int, float] = {}

    # ------------------------------------------------------------------ tokens
    def probabilities(self, hist_hash: np.ndarray, step_pos: np.ndarray, n_steps: np.ndarray,
                      step_start: np.ndarray | None = None, problem_keys: np.ndarray | None = None) -> np.ndarray:
        """Next-token probabilities [rows, vocab] for each history; ``step_start`` is the
        history hash where each row's step began (needed for determined steps),
        ``problem_keys`` each row's problem key (needed when ``per_problem_text``)."""
        if self.p.per_problem_text and problem_keys is None:
            raise ValueError("the token law depends on the problem here: pass each row's problem key")
        vc = self.p.content_vocab
        h = np.asarray(hist_hash, dtype=np.uint64)
        mult = ((h >> np.uint64(33)).astype(np.int64) % (vc // 2)) * 2 + 1  # odd: a bijection mod 2^k
        shift = (h & np.uint64(vc - 1)).astype(np.int64)
        ranks = (mult[:, None] * self._arange[None, :] + shift[:, None]) & (vc - 1)
        if self.p.token_overlap_by_position:
            law = np.minimum(np.asarray(step_pos), len(self._logp) - 1)
        else:
            law = (np.asarray(step_pos) >= self.p.head_tokens).astype(np.int64)
        content = np.exp(self._logp[law[:, None], ranks])
        stop = self._stop[np.minimum(step_pos, len(self._stop) - 1)]
        if self.p.sibling_length_share > 0.0:
            if step_start is None:
                raise ValueError("sibling_length_share > 0: the token law needs where each row's step began")
            stop = self._shared_length_stop(stop, np.asarray(step_start, dtype=np.uint64), np.asarray(step_pos))
        eos = self._eos_hazard(np.asarray(n_steps), problem_keys)
        probs = np.empty((len(h), self.vocab_size), dtype=np.float64)
        probs[:, N_SPECIAL:] = content * (1.0 - stop)[:, None]
        probs[:, EOS] = stop * eos
        probs[:, DELIMITER] = stop * (1.0 - eos)
        if self.p.identical_step_rate > 0.0 and step_start is not None:
            spread = problem_keys is not None and self.p.determined_problem_spread > 0.0
            z = self.problem_z(problem_keys) if spread else None
            self._determine(probs, np.asarray(step_start, dtype=np.uint64), ranks[:, 0], step_pos, eos,
                            np.asarray(n_steps), z)
        return probs

    def _shared_length_stop(self, stop: np.ndarray, start: np.ndarray, step_pos: np.ndarray) -> np.ndarray:
        """Rows whose step takes its length from its start (``sibling_length_share``) end
        exactly at it: stop 1 at the step's last position, 0 before."""
        shared = unit_np(combine_np(start, np.uint64(0xD3B))) < self.p.sibling_length_share
        if not shared.any():
            return stop
        stop = stop.copy()
        stop[shared] = (step_pos[shared] >= self.determined_length(start[shared]) - 1).astype(np.float64)
        return stop

    def _determine(self, probs: np.ndarray, start: np.ndarray, top: np.ndarray, step_pos, eos, rounds,
                   problem_z=None) -> None:
        """Rows in a determined step get one-hot distributions: the history's top token
        until the step's length (fixed by the step's start), then its end token. A row's
        round is its completed steps."""
        det = unit_np(combine_np(start, np.uint64(0xD37))) < self.p.determined_share(rounds, problem_z)
        if not det.any():
            return
        rows = np.flatnonzero(det)
        s = start[rows]
        length = self.determined_length(s)
        pos = np.asarray(step_pos)[rows]
        ends = pos >= length - 1
        end_tok = np.where(unit_np(combine_np(s, np.uint64(0xD39))) < eos[rows], EOS, DELIMITER)
        probs[rows] = 0.0
        probs[rows, np.where(ends, end_tok, N_SPECIAL + top[rows])] = 1.0

    def is_determined(self, start: int, r: int = 0, z: float | None = None) -> bool:
        """Whether the round-r step that begins at history hash ``start`` (of a problem
        with draw z) is determined."""
        return self.p.identical_step_rate > 0.0 and to_unit(combine(start, 0xD37)) < self.p.determined_share(r, z)

    def _determined_factor(self, start: int, r: int, z: float | None = None) -> float:
        """The hazard multiplier of a round-r step: ``determined_hazard_factor`` if it is
        determined, else 1."""
        p = self.p
        if p.determined_hazard_factor == 1.0 or p.identical_step_rate == 0.0:
            return 1.0
        return p.determined_hazard_factor if self.is_determined(start, r, z) else 1.0

    @staticmethod
    def problem_z(problem_key, salt: int = 0xD3A):
        """The problem's standard normal draw (scalar or array of keys) for its determined
        share (salt 0xD3A) or its solution length (0x57E)."""
        if np.ndim(problem_key):
            u = unit_np(combine_np(np.asarray(problem_key, dtype=np.uint64), np.uint64(salt)))
            return ndtri(np.clip(u, 1e-12, 1.0 - 1e-12))
        return float(ndtri(min(max(to_unit(combine(problem_key, salt)), 1e-12), 1.0 - 1e-12)))

    def _eos_hazard(self, n_steps: np.ndarray, problem_keys) -> np.ndarray:
        """P(the step ending here ends the path | it ends) for rows with n_steps completed
        steps: the hazard of the steps law, each problem's own median when
        ``steps_problem_sigma`` > 0 (the law discretised by ceil, as ``lognormal_hazard``)."""
        p = self.p
        if p.steps_problem_sigma == 0.0:
            return self._eos[np.minimum(n_steps, len(self._eos) - 1)]
        log_med = math.log(p.steps_median) + p.steps_problem_sigma * self.problem_z(np.asarray(problem_keys), 0x57E)
        n = np.asarray(n_steps, dtype=np.float64)
        with np.errstate(divide="ignore"):
            lo = np.where(n > 0, ndtr((np.log(np.maximum(n, 1e-300)) - log_med) / p.steps_sigma), 0.0)
        hi = ndtr((np.log(n + 1.0) - log_med) / p.steps_sigma)
        surv = 1.0 - lo
        return np.clip(np.where(surv > 1e-12, (hi - lo) / np.maximum(surv, 1e-300), 1.0), 0.0, 1.0)

    def determined_length(self, start: np.ndarray) -> np.ndarray:
        """A determined step's length (tokens, its end token included): the step-length
        law's quantile at a uniform fixed by the step's start."""
        return self.p.step_length_at(unit_np(combine_np(start, np.uint64(0xD38))))

    def logits(self, hist_hash: np.ndarray, step_pos: np.ndarray, n_steps: np.ndarray,
               step_start: np.ndarray | None = None, problem_keys: np.ndarray | None = None) -> torch.Tensor:
        probs = self.probabilities(hist_hash, step_pos, n_steps, step_start, problem_keys)
        with np.errstate(divide="ignore"):
            return torch.from_numpy(self.temperature * np.log(probs))

    def logits_for(self, seqs, problem_keys=None) -> torch.Tensor:
        """Logits of the next token of each physical sequence (its history hash, position
        in the step and completed steps): what a backend returns for rows wanting logits.
        ``problem_keys``: each sequence's problem key, needed when ``per_problem_text``."""
        start = keys = None
        if self.p.identical_step_rate > 0.0 or self.p.sibling_length_share > 0.0:
            start = np.fromiter((step_start_hash(s.members[0]) for s in seqs), dtype=np.uint64, count=len(seqs))
        if problem_keys is not None:
            keys = np.fromiter(problem_keys, dtype=np.uint64, count=len(seqs))
        return self.logits(
            np.fromiter((s.hist_hash for s in seqs), dtype=np.uint64, count=len(seqs)),
            np.fromiter((s.step_pos for s in seqs), dtype=np.int64, count=len(seqs)),
            np.fromiter((s.n_steps for s in seqs), dtype=np.int64, count=len(seqs)),
            start, keys,
        )

    def prompt_tokens(self, problem_key: int, length: int) -> list[int]:
        vc = self.p.content_vocab
        hs = combine_np(np.full(length, problem_key, dtype=np.uint64), np.arange(length, dtype=np.uint64))
        return (N_SPECIAL + (hs % np.uint64(vc)).astype(np.int64)).tolist()

    # ------------------------------------------------------------------ latent state and rewards
    def on_track(self, path: list[Any], difficulty: float, problem_key: int = 0) -> bool:
        """Latent correctness of a path (list of candidates from round 0) of the problem
        ``problem_key``, memoised by step hash."""
        ok = True
        for c in path:
            cached = self._on_track.get(c.end_hash)
            if cached is None:
                cached = ok and not self._lost(c, difficulty, problem_key)
                self._on_track[c.end_hash] = cached
            ok = cached
        return ok

    def _lost(self, c: Any, difficulty: float, problem_key: int = 0) -> bool:
        """Whether the path loses track at candidate c's step. The uniform is, with
        probability ``problem_step_correlation``, the problem's shared one for c's round
        (every path of the problem meets the same hard step), else with probability rho
        its parent's shared one (siblings then err together), else the candidate's own;
        the hazard falls geometrically with the round."""
        p = self.p
        z = self.problem_z(problem_key) if p.determined_problem_spread > 0.0 else None
        hazard = self._round_hazard(c, difficulty) * self._determined_factor(step_start_hash(c), max(c.round, 0), z)
        own = to_unit(combine(c.end_hash, 0xE77))
        if p.problem_step_correlation > 0.0 and to_unit(combine(c.end_hash, 0x5E7)) < p.problem_step_correlation:
            own = self._problem_draw(c, problem_key)
        elif p.sibling_error_correlation > 0.0 and to_unit(combine(c.end_hash, 0x51C)) < p.sibling_error_correlation:
            own = to_unit(combine(step_start_hash(c), 0xC0E))
        return own < hazard

    def _round_hazard(self, c: Any, difficulty: float) -> float:
        """The mean hazard of c's round (before the determined-step factor)."""
        return self.p.error_rate * difficulty * self.p.round_factor(c.round)

    @staticmethod
    def _problem_draw(c: Any, problem_key: int) -> float:
        """The problem's shared uniform for c's round (the same for every path of it)."""
        return to_unit(combine(combine(problem_key, max(c.round, 0)), 0x5D1))

    def _seen_on_track(self, path: list[Any], difficulty: float, problem_key: int, key: int) -> bool:
        """What the PRM sees of the path's last step: its latent state, or (a share 1 -
        ``prm_step_sensitivity`` of steps, drawn from the step's reward ``key``, so steps
        sharing a score share it too) whether its round is one where the problem's hard
        step holds (the problem's draw at or above the round's mean hazard)."""
        c = path[-1]
        p = self.p
        if p.prm_step_sensitivity < 1.0 and to_unit(combine(key, 0x5E5)) >= p.prm_step_sensitivity:
            return self._problem_draw(c, problem_key) >= self._round_hazard(c, difficulty)
        return self.on_track(path, difficulty, problem_key)

    def step_rewards(self, path: list[Any], difficulty: float, problem_key: int = 0) -> list[float]:
        out = []
        for i, c in enumerate(path):
            r = self._reward.get(c.end_hash)
            if r is None:
                key = self._reward_key(path[: i + 1], difficulty, problem_key)
                r = self._draw_reward(key, self._seen_on_track(path[: i + 1], difficulty, problem_key, key))
                self._reward[c.end_hash] = r
            out.append(r)
        return out

    def _reward_key(self, path: list[Any], difficulty: float, problem_key: int) -> int:
        """The hash a step's reward is drawn from: its own end, or (a share
        ``round_score_share`` of steps) its problem's round's: the right step's for an
        on-track step, one of the wrong steps' (Zipf, ``wrong_score_overlap``) for
        an off-track one."""
        c = path[-1]
        share = self.p.round_score_share
        if share == 0.0 or to_unit(combine(c.end_hash, 0x5C6)) >= share:
            return c.end_hash
        round_key = combine(combine(problem_key, max(c.round, 0)), 0x5C7)
        if self.on_track(path, difficulty, problem_key):
            return round_key
        u = to_unit(combine(c.end_hash, 0x5C8))
        return combine(round_key, 1 + int(np.searchsorted(self._wrong_cdf, u, side="right")))

    def _draw_reward(self, h: int, on_track: bool) -> float:
        share = self.p.exact_one_share * (1.0 if on_track else self.p.off_track_one_factor)
        if to_unit(combine(h, 0x5C0)) < share:
            return 1.0
        a, b = self.p.on_beta if on_track else self.p.off_beta
        u = to_unit(combine(h, 0xBE7A))
        return float(min(betaincinv(a, b, u), 1.0 - 1e-9))

    def answer(self, path: list[Any], difficulty: float, problem_key: int, reference: str) -> str | None:
        last = path[-1]
        if last.end_reason != "eos":
            return None  # no final answer written
        if self.on_track(path, difficulty, problem_key):
            return reference
        if self.p.off_track_correct_share > 0.0 and to_unit(combine(last.end_hash, 0xC0A)) < self.p.off_track_correct_share:
            return reference  # lost track on a step that did not change the result
        k = combine(last.end_hash, 0xA45) % self.p.wrong_answers
        return f"wrong-{mix64(problem_key) % 997}-{k}"


def step_start_hash(c: Any) -> int:
    """The history hash where candidate c's step began: its parent's end, or for a
    round-0 candidate its request's root (the prompt is fixed for the request)."""
    parent = c.parent
    if parent is not None and parent.round >= 0:
        return parent.end_hash
    return combine(0x500, c.request_id)


def measure_sibling_overlap(workload: SyntheticWorkload, n_groups: int = 200, m: int = 4, seed: int = 0) -> float:
    """Share of common tokens among siblings, measured by sampling whole steps.

    For each group, m siblings draw a step from one history with the paired sampler;
    the overlap is the fraction of token positions (up to the shorter step of each
    pair) where a pair holds the same token, averaged over pairs and groups.
    """
    from specscale.hashing import child_key, roll, root_key
    from specscale.engine.sampler import SamplingParams, sample_rows

    params = SamplingParams(workload.temperature, 1.0)
    shares = []
    for g in range(n_groups):
        parent = root_key(seed, g)
        keys = [child_key(parent, j) for j in range(m)]
        hashes = [combine(parent, 0x51B)] * m
        steps: list[list[int]] = [[] for _ in range(m)]
        alive = list(range(m))
        pos = 0
        while alive and pos < workload.p.max_step_len:
            logits = workload.logits(
                np.asarray([hashes[i] for i in alive], dtype=np.uint64),
                np.full(len(alive), pos, dtype=np.int64), np.full(len(alive), 2, dtype=np.int64),
            )
            toks = sample_rows(
                logits, np.arange(len(alive)), np.asarray([keys[i] for i in alive], dtype=np.uint64),
                np.full(len(alive), pos, dtype=np.uint64), params,
            )
            nxt = []
            for i, t in zip(alive, toks.tolist()):
                steps[i].append(t)
                hashes[i] = roll(hashes[i], t)
                if t >= N_SPECIAL:
                    nxt.append(i)
            alive = nxt
            pos += 1
        for a in range(m):
            for b in range(a + 1, m):
                n = min(len(steps[a]), len(steps[b]))
                same = sum(x == y for x, y in zip(steps[a][:n], steps[b][:n]))
                shares.append(same / n)
    return float(np.mean(shares))
