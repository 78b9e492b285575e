#!/usr/bin/env bash
# One GPU check, no network, under 8 minutes on one GPU (every step has a deadline):
#   1. GPU tests (tests/engine/torch/test_gpu.py + the decode-graph tests): CUDA-graph
#      replay == eager, logits == transformers (prefill and graph-replayed decode),
#      FlashInfer attention == torch attention when flashinfer is importable;
#   1b. host work per decode iteration and per PRM batch (runners/bench_host_overhead.py);
#   2. decode micro-benchmark: Qwen2.5-7B-sized random weights, batch 1..256, eager and
#      CUDA-graph replay side by side, against the HBM roofline (runners/bench_decode.py);
#   3. policies: nonspec, spec, ep_cd, full on the Qwen2.5-7B pair (generator + PRM, random
#      weights) in synthetic-token mode, beam 8, concurrency 32 (runners/bench_policies.py),
#      with the PRM prefix cache on, then off;
#   (1. also runs the PRM-cache equality tests, tests/engine/torch/test_prm_cache.py, on CUDA,
#   and tests/engine/torch/test_device_sync.py: at most one synchronisation per generation
#   iteration and per PRM batch, event-timed seconds against a synchronised wall clock)
#   3b. a cost profile of the device for the sim (runners/profile_engine.py, small grid):
#      <hw>-qwen2.5-7b.yaml in OUT_DIR, for conf/hardware/profiled/;
#   4. if flashinfer is importable: its tests and the decode benchmark with its attention
#      (last: its kernels are JIT-compiled by runners/flashinfer_warmup.py in the
#      background while steps 1-3 run).
# Writes at most 6 files to OUT_DIR (the device tool returns 8 at most): gpu_check.json (every
# figure: environment, decode rows, policy rows, return codes; runners/gpu_check_report.py),
# gpu_check.log (all output), tests.xml, tests_flashinfer.xml, flashinfer_jit.log, the profile yaml.
#
# With the device tool: bash runners/fetch_gpu_wheels.sh here, then
#   run(carry=[".whl"], timeout_s=540, command="bash runners/gpu_check.sh $OUT")
#
#   runners/gpu_check.sh OUT_DIR [N_PROBLEMS]
#   GPU_CHECK_CPU=1 runners/gpu_check.sh OUT_DIR   # smoke run of this script on a CPU machine
#                                                  # (reduced models; figures meaningless)
#
# Packages the GPU image lacks travel as wheels in .whl/ (runners/fetch_gpu_wheels.sh here,
# then carry .whl): installed offline into /tmp/site.
set -uo pipefail
OUT="${1:?usage: runners/gpu_check.sh OUT_DIR [N_PROBLEMS]}"
NPROB="${2:-16}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"  # all steps together; the device call allows 8 minutes
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d /tmp/gpu_check.XXXXXX)"  # intermediate files (gathered into gpu_check.json)
exec > >(tee "$OUT/gpu_check.log") 2>&1
PY="${PYTHON:-python3}"  # the GPU image's python3 holds PyTorch
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

left() { echo $(( BUDGET_S - SECONDS )); }
# step NAME CAP CMD...: run CMD under min(CAP, time left)
step() {
  local name="$1" cap="$2"; shift 2
  local t; t=$(left)
  (( t < cap )) && cap=$t
  if (( cap < 10 )); then echo "gpu_check: no time left for $name"; return 124; fi
  echo "== $name (limit ${cap} s)"
  timeout -k 5 "$cap" "$@"
  local rc=$?
  (( rc == 124 )) && echo "gpu_check: $name hit its ${cap} s limit"
  return $rc
}

if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --root-user-action=ignore \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site" \
    || echo "gpu_check: installing .whl/ failed; continuing with what the image has"
fi
if ! "$PY" -c "import hydra, omegaconf, math_verify, datasets" 2>/dev/null; then
  echo "gpu_check: hydra-core / omegaconf / math-verify / datasets missing: run runners/fetch_gpu_wheels.sh and carry .whl"
fi

CPU="${GPU_CHECK_CPU:-0}"
if [[ "$CPU" != 1 ]] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device on this machine; nothing to run (GPU_CHECK_CPU=1 smoke-runs the script on CPU)"
  echo '{"cuda": false}' > "$OUT/gpu_check.json"
  exit 0
fi
if [[ "$CPU" == 1 ]]; then
  BATCHES="1,4,16"; NPROB=2; POLICY_ARGS=(--beam 4 --concurrency 2 --max-rounds 3 --graphs on); DEC_ARGS=(--graphs on)
else
  BATCHES="1,2,4,8,16,32,64,128,256"; POLICY_ARGS=(); DEC_ARGS=()
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$WORK/gpu.txt" 2>/dev/null || true
FLASHINFER=$("$PY" -m runners.gpu_check_report env "$WORK")
echo "env: $(cat "$WORK/env.json" | tr -d '\n ')"

HW=h200
case "$(cat "$WORK/gpu.txt" 2>/dev/null)" in *A100*) HW=a100 ;; *H100*) HW=h100 ;; esac

# FlashInfer compiles its kernels with nvcc on first use (minutes for Hopper's FA3 prefill):
# build them in the background (CPU) while the torch-attention steps below use the GPU.
cuda_home_for_jit() {
  local nvcc; nvcc="$(command -v nvcc || true)"
  if [[ -z "${CUDA_HOME:-}" ]]; then
    if [[ -n "$nvcc" ]]; then CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$nvcc")")")"
    elif [[ -x /usr/local/cuda/bin/nvcc ]]; then CUDA_HOME=/usr/local/cuda
    else return 1; fi
  fi
  if [[ ! -e "$CUDA_HOME/lib64/libcudart.so" ]]; then
    # A pip-layout toolkit (lib/, versioned libcudart only): FlashInfer links -L$CUDA_HOME/lib64 -lcudart.
    local shim=/tmp/cuda_home_shim d f
    mkdir -p "$shim/lib64"
    for d in bin include nvvm; do [[ -e "$CUDA_HOME/$d" ]] && ln -sfn "$CUDA_HOME/$d" "$shim/$d"; done
    for f in "$CUDA_HOME"/lib/* "$CUDA_HOME"/lib64/*; do [[ -e "$f" ]] && ln -sfn "$f" "$shim/lib64/"; done
    f="$(ls "$shim"/lib64/libcudart.so.* 2>/dev/null | head -1)"
    [[ -n "$f" ]] && ln -sfn "$(readlink -f "$f")" "$shim/lib64/libcudart.so"
    if ! ls "$shim"/lib64/stubs/libcuda.so "$shim"/lib64/libcuda.so >/dev/null 2>&1; then  # FlashInfer links -lcuda
      f="$(ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 2>/dev/null | head -1)"
      [[ -n "$f" ]] && ln -sfn "$f" "$shim/lib64/libcuda.so"
    fi
    CUDA_HOME="$shim"
  fi
  export CUDA_HOME
}
JIT_PID=
if [[ "$FLASHINFER" == 1 && "$CPU" != 1 ]]; then
  if cuda_home_for_jit; then
    ARCH=$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
    echo "gpu_check: building FlashInfer kernels in the background (CUDA_HOME=$CUDA_HOME, arch $ARCH)"
    ( MAX_JOBS=12 FLASHINFER_CUDA_ARCH_LIST="$ARCH" timeout -k 5 330 "$PY" -m runners.flashinfer_warmup \
        > "$OUT/flashinfer_jit.log" 2>&1; echo $? > "$WORK/flashinfer_jit.rc" ) &
    JIT_PID=$!
  else
    echo "gpu_check: no nvcc / CUDA_HOME: FlashInfer kernels will be built (or fail) on first use"
  fi
fi

step tests 150 "$PY" -m pytest -p no:cacheprovider -q -rs -k "not flashinfer" \
  tests/engine/torch/test_gpu.py tests/engine/torch/test_decode_graphs.py tests/engine/torch/test_prm_cache.py \
  tests/engine/torch/test_device_sync.py --junitxml="$OUT/tests.xml"
TEST_RC=$?
step decode 100 "$PY" -m runners.bench_decode --model qwen2.5-7b --hardware "$HW" --ctx 512 --iters 10 \
  --batch "$BATCHES" --attention torch "${DEC_ARGS[@]}" --json "$WORK/decode.json"
# Host work per decode iteration (256 rows x 2k context) and per PRM batch, beside the stored
# baseline (results/bench/bench_host_overhead.json, a CPU figure: the table says the machine differs).
HOST_DEV=cuda; [[ "$CPU" == 1 ]] && HOST_DEV=cpu
step host_overhead 40 "$PY" -m runners.bench_host_overhead --device "$HOST_DEV" --repeat 10 --json "$WORK/host_overhead.json"
step policies 150 "$PY" -m runners.bench_policies --model qwen2.5-7b --hardware "$HW" --n-problems "$NPROB" \
  --attention torch "${POLICY_ARGS[@]}" --json "$WORK/policies.json"
step policies_nocache 120 "$PY" -m runners.bench_policies --model qwen2.5-7b --hardware "$HW" --n-problems "$NPROB" \
  --attention torch "${POLICY_ARGS[@]}" --set engine.prm_prefix_cache=false --json "$WORK/policies_nocache.json"
# A cost profile of this device for the sim: the real-size pair with random weights over
# the small grid; the yaml comes back
# in OUT_DIR, ready for conf/hardware/profiled/ (hardware=profiled/<name>).
if [[ "$CPU" == 1 ]]; then
  PROF_ARGS=(--name cpu-smoke --reps 1)
else
  PROF_ARGS=(--name "$HW-qwen2.5-7b" --reps 3 --set model=qwen2.5-7b --set model.load_format=random
             --set engine.synthetic_tokens=true)
fi
step profile 90 "$PY" -m runners.profile_engine --grid small "${PROF_ARGS[@]}" --out-conf "$OUT" --out-table "$WORK"
# engine=vllm on the GPU: vLLM's CUDA wheel is far above the 64 MiB a
# device call can carry, so this step runs only where the image itself has vLLM, and only
# when asked (GPU_CHECK_VLLM=1: two 7B engines start in ~1-2 min, beyond the usual budget).
if [[ "${GPU_CHECK_VLLM:-0}" == 1 ]] && "$PY" -c "import vllm" >/dev/null 2>&1; then
  step engines 240 "$PY" -m runners.bench_engines --beam 4 --n-problems "$NPROB" --decode "" \
    --set model=qwen2.5-7b --set model.load_format=random --json "$WORK/engines.json"
else
  echo "== engines: skipped (vLLM not in this image, or GPU_CHECK_VLLM!=1): cross-engine GPU figures unmeasured"
fi
FI_ARGS=()
if [[ -n "$JIT_PID" ]]; then
  echo "== waiting for the FlashInfer kernel build"
  wait "$JIT_PID"
  echo "flashinfer build rc $(cat "$WORK/flashinfer_jit.rc" 2>/dev/null):"; tail -5 "$OUT/flashinfer_jit.log"
fi
if [[ "$FLASHINFER" == 1 && "$CPU" != 1 ]]; then
  step tests_flashinfer 150 "$PY" -m pytest -p no:cacheprovider -q -rs -k flashinfer \
    tests/engine/torch/test_gpu.py --junitxml="$OUT/tests_flashinfer.xml"
  FI_ARGS=(--flashinfer-rc $?)
  step decode_flashinfer 60 "$PY" -m runners.bench_decode --model qwen2.5-7b --hardware "$HW" --ctx 512 \
    --iters 10 --batch "$BATCHES" --attention flashinfer "${DEC_ARGS[@]}" --json "$WORK/decode_flashinfer.json"
fi

"$PY" -m runners.gpu_check_report summary "$WORK" "$OUT" --tests-rc "$TEST_RC" "${FI_ARGS[@]}" --seconds "$SECONDS"
rm -rf "$WORK"
