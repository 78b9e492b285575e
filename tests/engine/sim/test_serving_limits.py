"""What waiting costs in the sim: the row cap (from the modelled GPU's serving defaults),
prompts as long as the prompt template makes them, and the KV budget's workspace."""
from __future__ import annotations

import pytest
import yaml

from cfg_helpers import compose_cfg, compose_spec
from contract import assert_same_tree
from specscale.cell import build_server
from specscale.compose import CONF_DIR
from specscale.data.prompt_length import piece_count, template_tokens
from specscale.data.prompts import SYSTEM_PROMPT
from specscale.metrics.summary import summarize


@pytest.mark.parametrize("hardware, rows, tokens", [("a100", 256, 8192), ("h100", 1024, 16384),
                                                    ("h200", 1024, 16384), ("profiled/cpu-tiny", 256, 8192)])
def test_the_row_cap_is_the_gpus_serving_default(hardware, rows, tokens):
    spec = compose_spec(f"hardware={hardware}", small=False)
    assert (spec.engine.max_num_seqs, spec.engine.max_num_batched_tokens) == (rows, tokens)
    assert compose_spec("hardware=a100", "engine.max_num_seqs=64", small=False).engine.max_num_seqs == 64


def test_a_binding_row_cap_makes_rows_wait_and_keeps_the_tree():
    base = ["policy=nonspec", "beam=8", "concurrency=8", "seed=21"]
    free = build_server(compose_cfg(*base)).run()
    server = build_server(compose_cfg(*base, "engine.max_num_seqs=12"))
    capped = server.run()
    s = summarize(capped, [60], 1)
    assert s["row_cap"] == 12 and s["rows_per_iteration_max"] == 12
    assert s["row_cap_bound_share"] > 0.2 and s["deferred_rows_mean"] > 0
    assert summarize(free, [60], 1)["rows_per_iteration_max"] > 12
    assert capped.makespan_s > free.makespan_s  # rows that wait for a slot cost time
    assert_same_tree(capped, free, "nonspec under a binding row cap")


@pytest.mark.parametrize("model", ["qwen2.5-7b", "qwen2.5-3b", "llama3.1-8b", "llama3.2-3b"])
def test_model_configs_hold_the_template_length_the_counter_gives(model):
    cfg = yaml.safe_load((CONF_DIR / "model" / f"{model}.yaml").read_text())
    arch = cfg["generator"]["arch"]
    assert cfg["sim"]["prompt_template_tokens"] == template_tokens(arch)
    assert template_tokens(arch) > piece_count(SYSTEM_PROMPT) > 100  # the scaffold adds to the system prompt


def test_sim_prompts_carry_one_shared_template_and_the_prm_sees_only_the_question():
    server = build_server(compose_cfg("model=qwen2.5-7b", "n_problems=2"))
    b = server.backend
    p0, p1 = b.problems[0], b.problems[1]
    assert p0.template_tokens == 170
    a, c = b.prompt_tokens(p0), b.prompt_tokens(p1)
    assert len(a) == 170 + p0.prompt_tokens and a[:170] == c[:170] and a[170:] == b.question_tokens(p0)

    class Root:  # the PRM prefix of a root candidate: format tokens and the question, no template
        request_id, path_tokens, round = 0, 0, -1

    assert b.prm_path_tokens(Root()) == b.prm_overhead + p0.prompt_tokens


def test_the_kv_pool_leaves_room_for_both_models_workspace():
    small = build_server(compose_cfg("hardware=a100", "engine.max_num_batched_tokens=2048", small=False,
                                     )).backend.cost
    big = build_server(compose_cfg("hardware=a100", "engine.max_num_batched_tokens=16384", small=False)).backend.cost
    assert big.activation_bytes()[0] > small.activation_bytes()[0]
    assert big.kv_capacity_tokens()[0] < small.kv_capacity_tokens()[0]
