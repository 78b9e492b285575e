"""Training is deterministic for a seed (a few steps of both loops, batch 4), and the
command writes checkpoints our loader reads."""

import json

import pytest
import torch

from specscale.data.arith import ArithSpec, held_out_questions
from specscale.testbed import models
from specscale.testbed.tokenizer import testbed_tokenizer as make_tokenizer  # a "test" name would be collected
from specscale.testbed.train import Schedule, train_generator, train_prm

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = dict(num_hidden_layers=1, intermediate_size=128)


def _losses(seed: int) -> tuple[list[float], list[float]]:
    tok = make_tokenizer(0)
    gen = models.generator(tok, seed, **SMALL)
    sched = Schedule(steps=3, batch=4, lr=1e-3, warmup=1)
    g_log, snap = train_generator(gen, tok, sched, seed + 1, ArithSpec(), held_out_questions(), snapshot_at=1)
    assert snap is not None and not torch.equal(snap["model.norm.weight"], gen.state_dict()["model.norm.weight"])
    prm = models.prm_from_generator(gen, seed + 2, extra_layers=1)
    p_log = train_prm(prm, tok, sched, seed + 3, ArithSpec(), held_out_questions())
    return g_log.losses, p_log.losses


def test_same_seed_same_losses():
    a, b = _losses(0), _losses(0)
    assert a == b
    assert a != _losses(1)  # the seed matters: the test could fail


def test_command_writes_loadable_checkpoints(tmp_path):
    from runners.train_testbed import main
    from specscale.engine.torch.runtime.model_runner import ModelRunner
    from specscale.engine.torch.prm.model import ProcessRewardModel

    main(["--gen-steps", "2", "--body-steps", "1", "--prm-steps", "1", "--prm-extra-layers", "1", "--batch", "2",
          "--gen-samples", "8",
          "--no-eval", "--out", str(tmp_path)])  # fmt: skip
    report = json.loads((tmp_path / "training.json").read_text())
    assert report["gen_steps"] == 2 and report["body_steps"] == 1 and report["prm_steps"] == 1
    runner = ModelRunner(tmp_path / "generator", dtype=torch.float32, num_blocks=8)
    assert runner.config.head_dim == 64 and runner.config.architecture == "Qwen2ForCausalLM"
    prm = ProcessRewardModel(tmp_path / "prm", dtype=torch.float32)
    assert prm.format.name == "qwen_math_prm" and prm.config.num_hidden_layers == runner.config.num_hidden_layers + 1
    scores = prm.score_paths("Compute 1+2+3.", [["1+2=3", "3+3=6", "The answer is \\boxed{6}."]])
    assert len(scores[0]) == 3 and all(0.0 < s < 1.0 for s in scores[0])


def test_extra_prm_layers_start_as_identities():
    tok = make_tokenizer(0)
    gen = models.generator(tok, 0, **SMALL).eval()
    prm = models.prm_from_generator(gen, 0, extra_layers=2).eval()
    assert prm.config.num_hidden_layers == gen.config.num_hidden_layers + 2
    ids = tok(["<|im_start|>user\nCompute 1+2.<|im_end|>\n"], add_special_tokens=False, return_tensors="pt")["input_ids"]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = gen.model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = prm(ids, mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("levels", [None, "1,2"])
def test_the_evaluation_reports_accuracy_and_aucs(tmp_path, levels):
    """The report's evaluation keys, on the shipped split or (with --levels) per level and
    on the hard split, each capped by --eval-problems (untrained models: the values only
    have to be what they count)."""
    from runners.train_testbed import main

    args = ["--gen-steps", "1", "--prm-steps", "1", "--batch", "2", "--gen-samples", "4", "--eval-problems", "2",
            "--out", str(tmp_path)] + (["--levels", levels] if levels else [])  # fmt: skip
    main(args)
    report = json.loads((tmp_path / "training.json").read_text())
    for key in ("greedy_accuracy", "sampled_accuracy_t0.8", "prm_auc_planted_first_wrong"):
        assert key in report
    if levels is None:
        assert report["eval_problems"] == 2
        return
    assert report["eval_problems"] == 10 and report["hard_eval_problems"] == 2  # 2 of each of the 5 test levels
    assert sorted(report["per_level"]) == ["1", "2", "3", "4", "5"]
    assert all(v["problems"] == 2 for v in report["per_level"].values())
    mean = sum(v["greedy_accuracy"] for v in report["per_level"].values()) / 5
    assert report["greedy_accuracy"] == pytest.approx(mean)
