#!/usr/bin/env bash
# The compiled path on a CUDA machine: CUDA graphs (compile=True picks mode "reduce-overhead" on
# CUDA) against eager decoding and HF's static cache + torch.compile, on the bundled models.
#
#   OUT=runs/gpu bash benchmarks/gpu_check.sh
#
# Steps, each writing into $OUT: (1) the compiled path equals the eager one token for token on
# held-out problems (fp32); (2) the benchmark in bfloat16 and float32 at batch 1, 4, 8, 16 with
# the compiled rows; (3) the compile cost (cold, restart, in process; GPU memory). Nothing is
# downloaded. Not run yet: no GPU was available to the sessions that wrote it (README says so).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this script needs a GPU')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" || true
python -m benchmarks.compiled_check --device cuda --n 200 --taus 1.0,0.95 --batch-sizes 1,16 | tee "$OUT/compiled_check.md"
METHODS=hf-generate,ar-cursor,ar-static-compile,ar-compiled,mars-cursor,mars-compiled,mars-lossless
for dtype in bfloat16 float32; do
  python -m benchmarks.bench --device cuda --dtype "$dtype" --methods "$METHODS" --batch-sizes 1,4,8,16 \
    --max-new-tokens 256 --output "$OUT/bench-$dtype"
done
python -m benchmarks.compile_cost --device cuda --batch-size 1 --output "$OUT/compile-cost"
echo "results in $OUT"
