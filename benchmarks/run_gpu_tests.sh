#!/usr/bin/env bash
# The GPU checks (pytest marker `gpu`: the trainers on CUDA in bf16), for a machine with a GPU and a CUDA build of
# torch already installed. Without network access, carry the other wheels in: on a machine with one,
#   python -m pip download -d wheelhouse -e ".[dev]" --no-deps trl transformers accelerate peft datasets
# and copy wheelhouse/ next to this checkout. The output goes to benchmarks/results/gpu_tests.txt (and to $OUT
# when set, e.g. on a lent device machine).
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible to torch')"
if [ -d wheelhouse ]; then
  python -m pip install --quiet --no-index --find-links wheelhouse -e ".[dev]"
else
  python -m pip install --quiet -e ".[dev]"
fi
out=benchmarks/results/gpu_tests.txt
{
  echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo no-git)"
  python -c "import torch, transformers, trl; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'device', torch.cuda.get_device_name(0), 'transformers', transformers.__version__, 'trl', trl.__version__)"
  python -m pytest -m gpu -v tests/test_gpu.py 2>&1
} | tee "$out"
if [ -n "${OUT:-}" ]; then cp "$out" "$OUT/"; fi
