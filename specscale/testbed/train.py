"""Training loops for the testbed generator and PRM (step-based schedules, seeded).

Determinism: every random draw comes from a seeded ``random.Random`` (data) or
``torch.manual_seed`` (init, dropout-free models), batches are built in a fixed order,
and the thread count is fixed by the caller, so a seed gives the same losses.
Data is unlimited and synthetic (``specscale.data.arith.problems`` with training seeds,
never a question of the shipped test split).
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specscale.data.arith import ArithSpec, problems
from specscale.testbed.encode import IGNORE, generator_batch, prm_batch
from specscale.testbed.prm_data import LabelledPath, sample_path

logger = logging.getLogger(__name__)


@dataclass
class Schedule:
    steps: int
    batch: int
    lr: float
    warmup: int = 30
    weight_decay: float = 0.01
    min_lr_ratio: float = 0.1

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        t = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


@dataclass
class TrainLog:
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def _optimizer(model, sched: Schedule):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": sched.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=sched.lr, betas=(0.9, 0.98))  # fmt: skip


def _lm_loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE)


def _log_every(step: int, sched: Schedule, loss: float, t0: float, what: str) -> None:
    if step % 50 == 0 or step == sched.steps - 1:
        logger.info("%s step %d/%d loss %.4f (%.0f s)", what, step, sched.steps, loss, time.perf_counter() - t0)


def train_generator(model, tokenizer, sched: Schedule, seed: int, spec: ArithSpec, exclude: frozenset[str],
                    snapshot_at: int | None = None) -> tuple[TrainLog, dict | None]:  # fmt: skip
    """LM training on reference solutions. ``snapshot_at``: also return the weights after
    that many steps (the shipped generator is an earlier, weaker snapshot of the body the
    PRM starts from: a verifier that computes better than the generator it checks, as
    in the paper's pairs, instead of one that shares every blind spot of it)."""
    stream = problems(seed, spec, exclude)
    snapshot = None
    opt = _optimizer(model, sched)
    log, t0 = TrainLog(), time.perf_counter()
    model.train()
    for step in range(sched.steps):
        if step == snapshot_at:
            snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
        ps = [next(stream) for _ in range(sched.batch)]
        b = generator_batch(tokenizer, [p.question for p in ps], [p.solution for p in ps])
        for g in opt.param_groups:
            g["lr"] = sched.lr_at(step)
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        loss = _lm_loss(logits, b.lm_labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log.losses.append(loss.item())
        _log_every(step, sched, log.losses[-1], t0, "generator")
    log.seconds = time.perf_counter() - t0
    model.eval()
    return log, snapshot


def train_prm(prm, tokenizer, sched: Schedule, seed: int, spec: ArithSpec, exclude: frozenset[str],
              lm_weight: float = 0.3, clean_share: float = 0.4,
              sampled: list[LabelledPath] | None = None) -> TrainLog:  # fmt: skip
    """Cross-entropy on [p(-), p(+)] at every step tag, plus ``lm_weight`` x the LM loss on
    the right part of each path (see encode.prm_batch).

    ``sampled``: the generator's own solutions, labelled by checking them; half of every
    batch comes from them (in a seeded order), half from planted errors. Planted errors
    alone teach the PRM to spot implausible slips, while the generator's are the plausible
    ones, where a PRM of the same size shares its blind spots (measured: AUC 0.37-0.47 at
    the generator's first wrong steps with planted errors only)."""
    stream, rng = problems(seed, spec, exclude), random.Random(seed)
    pool = list(sampled or [])
    rng.shuffle(pool)
    n_sampled = sched.batch // 2 if pool else 0
    opt = _optimizer(prm, sched)
    log, t0 = TrainLog(), time.perf_counter()
    prm.train()
    for step in range(sched.steps):
        paths = [sample_path(next(stream), rng, clean_share) for _ in range(sched.batch - n_sampled)]
        paths += [pool[(step * n_sampled + i) % len(pool)] for i in range(n_sampled)]
        b = prm_batch(tokenizer, paths)
        for g in opt.param_groups:
            g["lr"] = sched.lr_at(step)
        hidden = prm(b.input_ids, b.attention_mask)
        tag_logits = prm.score(hidden[b.tag_index])
        loss = F.cross_entropy(tag_logits.float(), b.tag_labels)
        if lm_weight:
            loss = loss + lm_weight * _lm_loss(prm.lm_logits(hidden), b.lm_labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(prm.parameters(), 1.0)
        opt.step()
        log.losses.append(loss.item())
        _log_every(step, sched, log.losses[-1], t0, "prm")
    log.seconds = time.perf_counter() - t0
    prm.eval()
    return log
