#!/usr/bin/env bash
# One GPU check, no network, < 8 minutes on one GPU:
#   1. GPU tests: FlashInfer attention == torch backend, CUDA-graph replay == eager,
#      logits == transformers on a small random checkpoint (tests/engine/torch/test_gpu.py);
#   2. decode micro-benchmark: Qwen2.5-7B-sized random weights, batch 1..256, vs the HBM roofline;
#   3. policy benchmark: nonspec, spec, ep_cd, full on Qwen2.5-7B-sized random weights
#      (generator and PRM) in synthetic-token mode, beam 8, concurrency 32, a few problems.
# Writes OUT_DIR/gpu_check.json (+ decode.json, policies.json, tests.xml) and prints tables.
#
#   runners/gpu_check.sh OUT_DIR [N_PROBLEMS]
#
# flashinfer-python: if it is not importable, a wheel carried in wheels/ (repo root) is
# installed offline (pip --no-index); without one the torch attention backend runs and
# the FlashInfer tests skip (the JSON records which backend ran).
set -uo pipefail
OUT="${1:?usage: runners/gpu_check.sh OUT_DIR [N_PROBLEMS]}"
NPROB="${2:-16}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
PY="${PYTHON:-python3}"  # the GPU image's python3 holds PyTorch

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device on this machine; nothing to run (the GPU tests skip on CPU)."
  echo '{"cuda": false}' > "$OUT/gpu_check.json"
  exit 0
fi
# Packages the GPU image lacks, carried as wheels (runners/fetch_gpu_wheels.sh; carry .whl).
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" \
    || echo "gpu_check: installing .whl/ failed; continuing with what the image has"
fi
if ! "$PY" -c "import hydra, omegaconf, math_verify" 2>/dev/null; then
  echo "gpu_check: hydra-core / omegaconf / math-verify missing: run runners/fetch_gpu_wheels.sh here and carry .whl"
fi
if ! "$PY" -c "import flashinfer" 2>/dev/null; then
  if ls wheels/flashinfer*.whl >/dev/null 2>&1; then
    echo "gpu_check: installing flashinfer from wheels/ (offline)"
    "$PY" -m pip install --no-index --find-links wheels/ wheels/flashinfer*.whl >"$OUT/pip.log" 2>&1 \
      || echo "gpu_check: flashinfer install failed (see $OUT/pip.log); continuing with the torch backend"
  else
    echo "gpu_check: flashinfer not importable and no wheel in wheels/: torch attention backend only"
  fi
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null || true

echo "== 1. GPU tests"
timeout 180 "$PY" -m pytest -q -rs tests/engine/torch/test_gpu.py --junitxml="$OUT/tests.xml" 2>&1 | tail -20
TEST_RC=${PIPESTATUS[0]}

HW=h200
case "$(cat "$OUT/gpu.txt" 2>/dev/null)" in *A100*) HW=a100 ;; *H100*) HW=h100 ;; esac

echo "== 2. decode micro-benchmark (qwen2.5-7b, random weights, roofline of $HW)"
timeout 150 "$PY" -m runners.bench_decode --model qwen2.5-7b --hardware "$HW" --ctx 512 --iters 10 \
  --json "$OUT/decode.json" 2>&1 | tail -14

echo "== 3. policies (qwen2.5-7b pair, random weights, synthetic tokens, beam 8, concurrency 32)"
timeout 240 "$PY" - "$OUT" "$NPROB" "$HW" <<'PYEOF' 2>&1 | grep -v "^\[" | tail -20
import json, sys, time
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specscale.cell import run_cell
from specscale.engine.torch import build as torch_build

out, nprob, hw = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
conf = str(Path("conf").resolve())
loaded = {}
real = torch_build.build_models


def cached(cfg):  # one load of the two 7B models for all cells; a fresh KV pool per cell
    if "m" not in loaded:
        loaded["m"] = real(cfg)
    runner, prm = loaded["m"]
    if runner.graphs is None:
        runner.allocate_kv_cache(torch_build._kv_blocks(cfg, runner, runner.device))
    return runner, prm


torch_build.build_models = cached
rows = []
for policy in ["nonspec", "spec", "ep_cd", "full"]:
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "engine=torch", "engine.synthetic_tokens=true", "model=qwen2.5-7b", "model.load_format=random",
            f"hardware={hw}", "dataset=math500", f"policy={policy}", "beam=8", "concurrency=32",
            f"n_problems={nprob}", "seed=0", "progress=false", "wandb.mode=disabled", "search.max_rounds=40",
        ])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg.pop("hydra", None)
    t0 = time.perf_counter()
    s = run_cell(cfg)
    runner = loaded["m"][0]
    rows.append({k: s.get(k) for k in ("policy", "throughput_tok_s", "decoded_tok_s", "norm_latency_ms_per_tok",
                                       "makespan_s", "accuracy", "leaked_blocks")}
                | {"wall_s": time.perf_counter() - t0, "attention": runner.backend.name,
                   "cuda_graphs": runner.graphs is not None})
base = rows[0]["throughput_tok_s"]
for r in rows:
    r["ratio_to_nonspec"] = r["throughput_tok_s"] / base if base else None
(out / "policies.json").write_text(json.dumps(rows, indent=1))
print(f"{'policy':<8} {'tok/s':>9} {'x nonspec':>9} {'decoded/s':>10} {'ms/tok':>8} {'wall s':>7}")
for r in rows:
    print(f"{r['policy']:<8} {r['throughput_tok_s']:>9.0f} {r['ratio_to_nonspec']:>9.2f} "
          f"{(r['decoded_tok_s'] or 0):>10.0f} {(r['norm_latency_ms_per_tok'] or 0):>8.2f} {r['wall_s']:>7.1f}")
PYEOF

"$PY" - "$OUT" "$TEST_RC" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
load = lambda n: json.loads((out / n).read_text()) if (out / n).is_file() else None
dec = load("decode.json")
fig = {"cuda": True, "gpu": (out / "gpu.txt").read_text().strip() if (out / "gpu.txt").is_file() else None,
       "tests_rc": int(sys.argv[2]), "decode": dec, "policies": load("policies.json")}
if dec:
    fig["decode_roofline_fraction"] = {str(r["batch"]): r["fraction"] for r in dec["rows"]}
(out / "gpu_check.json").write_text(json.dumps(fig, indent=1))
print("== summary: tests rc", fig["tests_rc"], "| roofline fraction @64/@256:",
      fig.get("decode_roofline_fraction", {}).get("64"), fig.get("decode_roofline_fraction", {}).get("256"))
PYEOF
