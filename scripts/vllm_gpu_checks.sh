#!/usr/bin/env bash
# The vLLM checks only a CUDA machine can run, in one go: sleep mode in the colocated engine (weights
# discarded between rollouts and re-pushed), the contract tests' vllm-colocate parameter (log-probs of
# the sampled distribution, filters, greedy, EOS, stop strings on GPU kernels), and, with two GPUs, a
# weight push over NCCL to a `vllm serve` (NCCL refuses two ranks on one device). Everything else about
# the vLLM engines runs on CPU in CI's vLLM lane (tests/vllm_cpu).
#
# Needs: a CUDA machine with `pip install torch==2.13.0 && pip install -e ".[test,vllm]"` done (vllm
# 0.32.0's CUDA wheel and its dependencies: several GB, so install before the clock starts). About 5-10
# minutes on one GPU (each test starts an engine; enforce_eager, no compilation).
#
#   scripts/vllm_gpu_checks.sh            # prints a pass/fail summary; exit status = pytest's
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; \
print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0), \
torch.cuda.device_count(), 'GPU(s)')"
python -m pytest -q -rA -p no:cacheprovider tests/rollout/test_vllm.py "tests/rollout/test_contract.py" -k "vllm"
