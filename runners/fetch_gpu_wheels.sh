#!/usr/bin/env bash
# Fetch, here (where the package registry is reachable), the pure-Python packages the
# GPU machine's image lacks, as wheels in .whl/ (excluded from git). A device call then
# carries .whl and runners/gpu_check.sh installs them offline into /tmp/site.
#
#   bash runners/fetch_gpu_wheels.sh        # then: run(carry=[".whl"], "bash runners/gpu_check.sh $OUT")
#
# The image (device KINDS.md, 2026-11) has torch, transformers, numpy, pandas, pyarrow,
# scipy, statsmodels, rich, tqdm, pyyaml, sympy, xxhash, fsspec, aiohttp; it lacks the
# Hydra stack, math-verify and datasets (+ dill, multiprocess), which the tests need
# (checked with GPU_CHECK_CPU=1 in a venv holding only the image's packages).
# FlashInfer: flashinfer-python 0.6.18.post1 is a JIT wheel (18 MB; kernels compiled by the
# image's nvcc on first use) + apache-tvm-ffi (3 MB); its other declared dependencies
# (cudnn-frontend, cutlass-dsl, cuda-tile, nccl4py) serve features this harness does not
# use, and `import flashinfer` does not need them. Everything here: ~23 MB (carry limit 64 MiB).
# vLLM (engine=vllm) is not fetched: its CUDA wheel is several hundred MB, far above the
# carry limit; gpu_check.sh runs its cross-engine step only on an image that has vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
PY="${PYTHON:-python3}"
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
  hydra-core==1.3.2 omegaconf==2.3.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
  flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.15.post2
# antlr4-python3-runtime 4.9.3 (the version Hydra and OmegaConf pin) ships as an sdist
# only: build its pure-Python wheel here.
"$PY" -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -la .whl
