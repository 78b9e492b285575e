"""The results store: one directory per cell, resumable sweeps, error records, index, W&B."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cfg_helpers import SMALL, compose_cfg, compose_spec
from specscale.settings.search_policy import ConfigError
from specscale.cell_job import run_and_store
from specscale.results.store import cell_dir, config_hash

ROOT = Path(__file__).resolve().parents[2]


def run_py(*args, timeout=300, check=True):
    multirun = [a for a in args if a == "-m"]
    rest = [a for a in args if a != "-m"]
    proc = subprocess.run([sys.executable, "run.py", *multirun, *SMALL, "wandb.mode=disabled", *rest],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def summaries(root: Path) -> list[Path]:
    return sorted(root.rglob("summary.json"))


def test_multirun_cells_index_and_resume(tmp_path):
    args = ["-m", "policy=nonspec,full", "beam=4,8", f"results_dir={tmp_path}", "experiment_name=t"]
    run_py(*args)
    cells = summaries(tmp_path)
    assert len(cells) == 4
    rel = {str(p.parent.relative_to(tmp_path / "t")) for p in cells}
    assert any(r.startswith("math500/qwen2.5-7b/nonspec/b4-c4-s0-") for r in rel)  # readable names
    index = pd.read_parquet(tmp_path / "t" / "index.parquet")
    assert len(index) == 4 and set(index["status"]) == {"ok"}
    assert {"throughput_tok_s", "cell_dir", "policy", "beam", "config_hash"} <= set(index.columns)
    for p in cells:
        assert (p.parent / "config.yaml").exists()
    mtimes = {p: p.stat().st_mtime_ns for p in cells}
    out = run_py(*args)
    assert "4 cells: 0 done, 4 skipped, 0 failed" in out.stdout + out.stderr
    assert {p: p.stat().st_mtime_ns for p in summaries(tmp_path)} == mtimes


# SIGKILL / SIGTERM mid-cell and the rerun: test_locking.py.


def test_failing_cell_is_recorded_and_the_sweep_goes_on(tmp_path):
    # A 1-block KV pool cannot hold a prompt: that cell raises at run time.
    out = run_py("-m", "engine.kv_blocks=1,null", "policy=nonspec", f"results_dir={tmp_path}")
    assert "2 cells: 1 done, 0 skipped, 1 failed" in out.stdout + out.stderr
    errors = list(tmp_path.rglob("error.json"))
    assert len(errors) == 1 and len(summaries(tmp_path)) == 1
    err = json.loads(errors[0].read_text())
    assert err["error_type"] == "KVCapacityError" and "KV pool" in err["error"]
    index = pd.read_parquet(tmp_path / "default" / "index.parquet")
    assert sorted(index["status"]) == ["failed", "ok"]


def test_unwritable_results_dir_fails_early(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="not writable"):
        run_and_store(compose_cfg(f"results_dir={blocker}", "wandb.mode=disabled"))


def test_irrelevant_switches_share_a_cell():
    a = compose_spec("policy=ep_cd", "policy.b_max=256")
    b = compose_spec("policy=ep_cd", "policy.b_max=4096")
    c = compose_spec("policy=full", "policy.b_max=256")
    d = compose_spec("policy=full", "policy.b_max=4096")
    assert config_hash(a) == config_hash(b) and config_hash(c) != config_hash(d)
    assert config_hash(compose_spec("progress=true")) == config_hash(compose_spec("progress=false"))
    assert cell_dir(a) != cell_dir(c)
    # adaptive verification ignores b_max and d_max but keeps the sibling trigger and the age cap
    ada = [compose_spec("policy=adaptive", *o) for o in (["policy.b_max=256"], ["policy.d_max=2"], [],
                                                         ["policy.age_cap_s=0.5"], ["policy.sibling_trigger=false"])]
    assert len({config_hash(x) for x in ada[:3]}) == 1 and len({config_hash(x) for x in ada[2:]}) == 3


def test_wandb_offline_run_holds_the_summary(tmp_path):
    from wandb_reader import summary

    result = run_and_store(compose_cfg(f"results_dir={tmp_path}", "wandb.mode=offline", "experiment_name=wb"))
    files = list(Path(result["cell_dir"]).rglob("run-*.wandb"))
    assert len(files) == 1
    s = summary(files[0])
    assert float(s["throughput_tok_s"]) == pytest.approx(result["summary"]["throughput_tok_s"])
    assert json.loads(s["policy"]) == "full" and "accuracy" in s


@pytest.mark.parametrize("launcher", ["submitit_local", "joblib"])
def test_launchers(tmp_path, launcher):
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else ["hydra.launcher.timeout_min=5"]
    out = run_py("-m", f"hydra/launcher={launcher}", *extra, "policy=nonspec,full", f"results_dir={tmp_path}")
    assert len(summaries(tmp_path)) == 2
    # The cells ran in other processes: the count comes from the launcher's returns.
    assert "[sweep] finished: 2 cells: 2 done, 0 skipped, 0 failed" in out.stdout + out.stderr
    assert len(pd.read_parquet(tmp_path / "default" / "index.parquet")) == 2


def test_slurm_example_config_composes():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", ["hydra/launcher=slurm_gpu"], return_hydra_config=True)
    assert cfg.hydra.launcher.gpus_per_node == 1
    assert "submitit" in cfg.hydra.launcher._target_
    assert "export HF_HUB_OFFLINE=1" in cfg.hydra.launcher.setup and cfg.hydra.launcher.constraint is None


def test_slurm_setup_and_constraint_reach_the_sbatch_script(tmp_path):
    # The submitit executor the launcher configures writes the sbatch script: no cluster needed.
    from hydra import compose, initialize_config_dir
    from submitit.slurm.slurm import _make_sbatch_string

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", ["hydra/launcher=slurm_gpu", "hydra.launcher.constraint=h100"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    script = _make_sbatch_string(command="python run.py", folder=str(tmp_path), job_name="t",
                                 constraint=launcher.constraint, setup=list(launcher.setup), gpus_per_node=1)
    assert "#SBATCH --constraint=h100" in script and "export HF_HUB_OFFLINE=1" in script


def test_context_and_settings_hashes():
    from specscale.results.store import context_hash, settings_hash

    a, b = compose_spec("policy=nonspec", "seed=1"), compose_spec("policy=full", "seed=2")
    assert context_hash(a) == context_hash(b) and settings_hash(a) == settings_hash(b)
    c = compose_spec("policy=nonspec", "beam=4")
    assert context_hash(c) != context_hash(a) and settings_hash(c) == settings_hash(a)
    d = compose_spec("policy=nonspec", "search.step_token_cap=32")  # no summary field names this
    assert settings_hash(d) != settings_hash(a)


def test_ray_launcher_config_asks_one_gpu_per_cell():
    """What needs no Ray: the launcher config itself (one GPU per cell, on the plugin's base)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.load(ROOT / "conf" / "hydra" / "launcher" / "ray_gpu.yaml")
    assert list(raw.defaults) == ["ray"]  # hydra-ray-launcher's own launcher config, extended
    assert raw.ray.remote.num_gpus == 1 and raw.ray.remote.num_cpus >= 1
    header = (ROOT / "conf" / "hydra" / "launcher" / "ray_gpu.yaml").read_text().splitlines()[0]
    assert header == "# @package hydra.launcher"


def test_ray_launcher_composes_with_the_plugin():
    pytest.importorskip("hydra_plugins.hydra_ray_launcher",
                        reason="hydra-ray-launcher is not installed (optional extra: pip install -e '.[ray]')")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", ["hydra/launcher=ray_gpu"], return_hydra_config=True)
    assert cfg.hydra.launcher.ray.remote.num_gpus == 1 and "RayLauncher" in cfg.hydra.launcher._target_
