"""Synthetic-token mode (engine.synthetic_tokens=true): real forwards of the tiny pair,
tokens and scores from the sim's workload. The search tree equals the sim backend's
with the same workload settings and seed, for every strict policy; model.load_format=
random runs the same way on a reduced paper architecture."""

from __future__ import annotations

import functools

import pytest
import torch

from cfg_helpers import compose_cfg
from contract import assert_same_tree, frames
from specscale.cell import build_server
from specscale.settings.search_policy import ConfigError
from specscale.engine.torch.synthetic import SyntheticTorchBackend

# Short steps and paths so the tiny models run a many-round search in a few seconds.
WORKLOAD = ["step_len_median=6.0", "steps_median=4.0", "content_vocab=64"]
COMMON = [
    "model=tiny", "dataset=fixture_math500", "n_problems=2", "progress=false", "wandb.mode=disabled",
    "search.max_rounds=6", "search.step_token_cap=24", "search.path_token_cap=96",
    "beam=4", "expansion=2", "concurrency=2", "seed=3",
]
SIM = ["engine=sim", *(f"engine.synthetic.{w}" for w in WORKLOAD)]
TORCH = ["engine=torch", "engine.synthetic_tokens=true", "engine.dtype=float32", "engine.cpu_kv_blocks=512",
         *(f"engine.synthetic.{w}" for w in WORKLOAD)]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny ops, one thread


@functools.lru_cache(maxsize=None)
def run(*overrides):
    return build_server(compose_cfg(*COMMON, *overrides, small=False)).run()




@pytest.mark.parametrize("policy,extra", [("nonspec", []), ("full", ["policy.pruning=strict"])])
def test_synthetic_torch_tree_equals_sim(policy, extra):
    ref = run(*SIM, f"policy={policy}", *extra)
    rounds, _ = frames(ref)
    assert len(rounds) >= 2 * 2 and any(len(set(s)) > 1 for s in rounds["member_scores"])
    got = run(*TORCH, f"policy={policy}", *extra)
    assert_same_tree(got, ref, f"torch synthetic {policy}")


def test_synthetic_backend_runs_real_forwards(monkeypatch):
    calls = {"gen": 0, "prm": 0}
    fwd, score = SyntheticTorchBackend.forward, SyntheticTorchBackend.score

    def counted_forward(self, batch):
        calls["gen"] += 1
        return fwd(self, batch)

    def counted_score(self, items):
        calls["prm"] += 1
        rows = self._paths.rows(items)  # the PRM rows hold exactly what the plan counts
        for it, row in zip(items, rows):
            assert len(row.token_ids) == it.n_new and row.start == it.n_cached
            assert it.n_new + it.n_cached == self.prm_path_tokens(it.candidate) + self.prm_closing_tokens
        return score(self, items)

    monkeypatch.setattr(SyntheticTorchBackend, "forward", counted_forward)
    monkeypatch.setattr(SyntheticTorchBackend, "score", counted_score)
    rec = build_server(compose_cfg(*COMMON, *TORCH, "policy=ep_cd", "n_problems=1", small=False)).run()
    assert calls["gen"] > 5 and calls["prm"] > 1 and rec.requests


def test_random_weights_reduced_paper_architecture(monkeypatch):
    # A Llama-3 pair (llama3 RoPE, RLHFlow causal-LM PRM) at reduced width, random weights.
    from specscale.engine.torch.model import configs as model_configs

    real = model_configs.config_for
    monkeypatch.setattr(model_configs, "config_for", lambda name: model_configs.reduced(real(name)))
    rec = build_server(compose_cfg(
        *COMMON, *TORCH, "model=llama3.1-8b", "model.load_format=random", "engine.dtype=float32",
        "policy=spec", "n_problems=1", "dataset=fixture_math500", small=False,
    )).run()
    assert rec.requests and len(rec.rounds) >= 1


def test_random_weights_need_synthetic_tokens():
    with pytest.raises(ConfigError, match="synthetic_tokens"):
        build_server(compose_cfg(*COMMON, "engine=torch", "model.load_format=random", small=False))


def test_synthetic_workload_settings_agree_between_engines():
    """A calibration that moves engine=sim's workload must move the torch synthetic mode's too."""
    sim = compose_cfg("engine=sim", small=False)["engine"]["synthetic"]
    torch_ = compose_cfg("engine=torch", small=False)["engine"]["synthetic"]
    assert sim == torch_
