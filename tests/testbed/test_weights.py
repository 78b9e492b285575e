"""The shipped testbed checkpoints (both pairs) load through our loader and through transformers, with equal outputs."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specscale.data.arith import held_out_problems
from specscale.engine.torch.attention.batch import BatchRow
from specscale.engine.checkpoints import resolve_checkpoint
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.testbed import checkpoint_dir
from specscale.testbed.encode import prompt_text

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = 1e-10  # float64 on both sides
PAIRS = ["", "levels/"]  # model=testbed's and model=testbed_levels's checkpoints (specscale/testbed/__init__.py)


def _text(p) -> str:
    return prompt_text(p.question) + p.solution


def test_hf_names_resolve_to_the_package_data():
    assert resolve_checkpoint("testbed/generator", "generator") == checkpoint_dir("generator")
    assert resolve_checkpoint("testbed/prm", "prm") == checkpoint_dir("prm")
    assert resolve_checkpoint("testbed/levels/prm", "prm") == checkpoint_dir("levels/prm")
    assert checkpoint_dir("levels/prm") != checkpoint_dir("prm")
    with pytest.raises(Exception, match="no such testbed model"):
        resolve_checkpoint("testbed/nope", "prm")


@pytest.mark.parametrize("pair", PAIRS)
def test_generator_logits_equal_transformers(pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint_dir(pair + "generator")
    tok = AutoTokenizer.from_pretrained(str(path))
    ref, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float64, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    runner = ModelRunner(path, dtype=torch.float64, block_size=16, num_blocks=64)
    assert runner.config.head_dim == 64
    ids = tok(_text(held_out_problems(1)[0]), add_special_tokens=False)["input_ids"]
    batch = runner.make_batch([BatchRow(ids, 0, list(range(-(-len(ids) // 16))))])
    ours = runner.model.compute_logits(runner.forward(batch))
    with torch.no_grad():
        theirs = ref.eval()(torch.tensor([ids])).logits[0]
    assert ours.shape == theirs.shape
    assert ((ours - theirs).abs().max() / theirs.abs().max()).item() < TOL
    # A trained model, not noise: it predicts the reference solution's digits.
    n_prompt = len(tok(prompt_text(held_out_problems(1)[0].question), add_special_tokens=False)["input_ids"])
    hits = (theirs[n_prompt - 1 : -1].argmax(-1) == torch.tensor(ids[n_prompt:])).double().mean().item()
    assert hits > 0.9


@pytest.mark.parametrize("pair", PAIRS)
def test_prm_rewards_equal_transformers_body_plus_score_head(pair):
    from transformers import AutoModel, AutoTokenizer

    path = checkpoint_dir(pair + "prm")
    tok = AutoTokenizer.from_pretrained(str(path))
    body, info = AutoModel.from_pretrained(str(path), dtype=torch.float64, output_loading_info=True)
    assert not info["missing_keys"], info
    assert {k.split(".")[0] for k in info["unexpected_keys"]} <= {"score"}  # the head transformers has no class for
    w = {k: v.double() for k, v in load_file(str(path / "model.safetensors")).items() if k.startswith("score.")}
    prm = ProcessRewardModel(path, dtype=torch.float64)
    ps = held_out_problems(4)
    sep = tok.convert_tokens_to_ids("<extra_0>")
    for p in ps:
        steps = p.steps()
        ours = prm.score_paths(p.question, [steps])[0]
        text = tok.apply_chat_template(
            [{"role": "system", "content": "ignored by this template"}, {"role": "user", "content": p.question},
             {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"}], tokenize=False)  # fmt: skip
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            h = body.eval()(input_ids=ids).last_hidden_state[0][ids[0] == sep]
        h = torch.relu(h @ w["score.0.weight"].T + w["score.0.bias"])
        theirs = (h @ w["score.2.weight"].T + w["score.2.bias"]).softmax(-1)[:, 1].tolist()
        assert ours == pytest.approx(theirs, rel=TOL, abs=TOL)


def test_the_levels_pair_is_its_recipes_and_meets_its_targets():
    """The shipped levels pair's training report is of ``train_testbed --pair levels`` (from
    scratch, no generator borrowed) and records the targets it was trained for."""
    import json

    from runners.train_testbed import parse_args

    report = json.loads((checkpoint_dir("levels/generator").parent / "training.json").read_text())
    recipe = parse_args(["--pair", "levels"])
    assert report["generator_from"] is None
    for key in ("gen_steps", "body_steps", "prm_extra_layers", "prm_steps", "gen_samples", "seed", "threads"):
        assert report[key] == getattr(recipe, key), key
    assert report["levels"] == [int(x) for x in recipe.levels.split(",")]
    assert report["prm_auc_generated_first_wrong"] >= 0.9
    assert recipe.out == checkpoint_dir("levels/generator").parent and recipe.pair == "levels"
    assert parse_args(["--pair", "levels", "--out", "/x", "--prm-steps", "3"]).out == Path("/x")  # explicit flags win
    assert parse_args(["--pair", "levels", "--prm-steps", "3"]).prm_steps == 3
