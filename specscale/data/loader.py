"""``load_problems``: dataset config -> list of ``Problem``."""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import Any, Mapping

from specscale.data.problem import Problem
from specscale.data.schemas import MAPPERS
from specscale.data.source import open_split
from specscale.settings.dataset import DatasetSpec, spec_from_config

logger = logging.getLogger(__name__)


def load_problems(cfg: DatasetSpec | Mapping[str, Any], n_problems: int | None = None) -> list[Problem]:
    """Load, sample and map the problems a dataset spec (a cell spec's ``dataset``) or a
    dataset config describes.

    ``cfg`` is a ``DatasetSpec`` or the ``dataset`` config group (dict or DictConfig)
    plus an optional ``n_problems``; the ``n_problems`` argument, when given, wins over the config
    key (Hydra keeps the group in struct mode, where adding a key is awkward).
    Order of operations: read the split, draw ``sample`` row
    indices with ``sample_seed`` (the paper evaluates 1,000 GSM8K test problems),
    keep the first ``n_problems`` of that draw, map rows to ``Problem``.
    Raises ``DatasetUnavailableError`` (naming the ``dataset.data_files`` override)
    when the data cannot be read.
    """
    spec = cfg if isinstance(cfg, DatasetSpec) else spec_from_config(cfg)
    if n_problems is not None:
        spec = replace(spec, n_problems=n_problems)
    dataset = open_split(spec)
    indices = sample_indices(len(dataset), spec.sample, spec.sample_seed)
    problems = rows_to_problems(dataset, indices, spec)
    if spec.n_problems is not None:
        if len(problems) < spec.n_problems:
            from specscale.settings.search_policy import ConfigError

            raise ConfigError(
                f"n_problems={spec.n_problems} but dataset {spec.name!r} has {len(problems)} usable problems "
                f"(split {spec.split!r}{f', sample={spec.sample}' if spec.sample is not None else ''}): "
                f"set n_problems<={len(problems)} or n_problems=all"
            )
        problems = problems[: spec.n_problems]
    return problems


def sample_indices(n_rows: int, sample: int | None, seed: int) -> list[int]:
    """Row indices to use: all in order, or ``sample`` of them drawn with ``seed``.

    ``random.Random(seed).sample`` is used because its output for a given seed is
    stable across Python versions and platforms, so "the GSM8K 1,000" is the same
    set everywhere. The draw's order is kept (not sorted), so any prefix taken by
    ``n_problems`` is itself a random subset. A sample larger than the split takes
    every row, in the drawn order.
    """
    if sample is None:
        return list(range(n_rows))
    return random.Random(seed).sample(range(n_rows), min(sample, n_rows))


def rows_to_problems(dataset: Any, indices: list[int], spec: DatasetSpec) -> list[Problem]:
    mapper = MAPPERS[spec.schema]
    problems: list[Problem] = []
    skipped = 0
    for index in indices:
        problem = mapper(dataset[index], index, spec.split, spec.name)
        if problem is None:
            skipped += 1
            continue
        problems.append(problem)
    if skipped:
        logger.warning("%s: skipped %d rows without a usable reference answer", spec.name, skipped)
    return problems
