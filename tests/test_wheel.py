"""The built wheel, installed in a fresh virtual environment, works like the checkout:
the `specscale` command runs a cell and the report has the paper's numbers, from a
directory outside the checkout."""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from cfg_helpers import SMALL

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(args, cwd, timeout=300):
    # No PYTHONPATH: the checkout must not leak into the installed environment.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc.stdout


def _share_site_packages(py: Path) -> None:
    """A .pth in the new venv naming this interpreter's site-packages directories (plain
    paths: their own .pth files, such as an editable install of this checkout, stay off)."""
    dirs = [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"],
            sysconfig.get_paths()["platlib"]]
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    target = Path(_run([str(py), "-c", purelib], cwd=py.parent).strip())
    lines = dict.fromkeys(d for d in dirs if Path(d).is_dir())
    (target / "_specscale_test_deps.pth").write_text("\n".join(lines) + "\n")


def test_wheel_install_runs_a_cell_and_the_report(tmp_path):
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    work.mkdir()
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
          str(ROOT)], cwd=tmp_path)
    wheel = next(dist.glob("specscale-*.whl"))
    # The dependencies (torch, ...) are reused, not downloaded: the new venv reads the
    # site-packages of the interpreter running the tests, a venv's own included (a venv made
    # with --system-site-packages would see the base interpreter's, not this venv's).
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py, cmd = venv / "bin" / "python", venv / "bin" / "specscale"
    _share_site_packages(py)
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd=tmp_path)
    # One interpreter for the package-data checks: the installed copy (not the checkout),
    # its configs and experiments, the paper CSV, the stored model configs (load_format=random).
    check = (
        "import specscale, specscale.resources as r\n"
        "from specscale.results.experiments import cells, names\n"
        "from specscale.engine.torch.model.configs import config_for\n"
        "print(specscale.__file__, r.conf_dir(), r.paper_csv())\n"
        "assert len(cells('fig13_ablation')) == 144 and 'fig16_lv_threshold' in names()\n"
        "assert config_for('Qwen/Qwen2.5-7B-Instruct')['hidden_size'] == 3584\n"
    )
    where = _run([str(py), "-c", check], cwd=work).split()
    assert len(where) == 3 and all(str(venv) in w for w in where), where

    results = tmp_path / "results"
    out = _run([str(cmd), "-m", *SMALL, "wandb.mode=disabled", f"results_dir={results}", "dataset=fixture_gsm8k",
                "policy=nonspec,full"], cwd=work)
    assert "2 cells: 2 done" in out  # the sweep ran through the installed skip-done sweeper
    summary = json.loads(next(results.rglob("summary.json")).read_text())
    assert summary["provenance"]["versions"]["specscale"] and summary["provenance"]["git"]["commit"] is None

    _run([str(py), "-m", "analysis.report", str(results / "default"), "--out", str(tmp_path / "report")], cwd=work)
    report = "\n".join(p.read_text() for p in (tmp_path / "report").rglob("*.md"))
    assert "specscale_reported.csv" in report
