#!/usr/bin/env bash
# GPU acceptance: the whole gate on a CUDA machine in one go, for a self-hosted GPU runner or a
# borrowed GPU box. Runs both engines of examples/gpu-qwen.yaml (vLLM 0.33.0 -> 0.34.0 on
# Qwen2.5-0.5B-Instruct, bf16 engine, fp32 reference), then prints the verdict, each engine's
# timings, the numerics it chose at run time and the memory it gave back before the reference
# loaded. Budget: under 10 minutes with warm venvs and weights (the first run installs two CUDA
# vLLM venvs with uv and downloads the model).
#
#   scripts/gpu_acceptance.sh [CONFIG] [OUT]       # default: examples/gpu-qwen.yaml, runs/gpu-acceptance-<time>
#
# It has NOT been run on this project's machines (no GPU with vLLM is reachable from them).
# Exit code: the gate's (0 PASS/WARN, 1 FAIL, 2 usage, 3 ERROR), or 4 when no CUDA GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."

config="${1:-examples/gpu-qwen.yaml}"
out="${2:-runs/gpu-acceptance-$(date -u +%Y%m%dT%H%M%SZ)}"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_acceptance: no CUDA GPU visible (nvidia-smi -L fails); this script needs one" >&2
    exit 4
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2

start=$SECONDS
code=0
python3 -m gate run -c "$config" --out "$out" --no-reuse || code=$?
echo "gpu_acceptance: gate run exited $code after $((SECONDS - start)) s" >&2

run="$out"
[[ -d "$run" ]] || run="$out.incomplete"
python3 - "$run" <<'PY'
import json
import sys
from pathlib import Path

run = Path(sys.argv[1])
report = run / "report.json"
if report.is_file():
    print(f"verdict: {json.loads(report.read_text())['verdict']}")
for engine in ("old", "new"):
    meta_path = run / "engines" / engine / "engine.json"
    if not meta_path.is_file():
        print(f"{engine}: no engine.json (see {run / 'engines' / engine / 'worker.log'})")
        continue
    meta = json.loads(meta_path.read_text())
    t, mem, num = meta["timings"], meta.get("memory") or {}, meta.get("numerics") or {}
    gib = lambda d: "?" if not d or d.get("device_used_bytes") is None else f"{d['device_used_bytes'] / 2**30:.1f} GiB"
    print(f"{engine}: vLLM {meta['identity']['vllm']} on {meta['identity']['device_name']}: "
          f"engine start {t['engine_start_s']:.0f} s, total {t['total_s']:.0f} s, reference {t['reference_tokens_per_s']:.0f} tok/s")
    print(f"  device memory in use: {gib(mem.get('engine_running'))} with the engine, "
          f"{gib(mem.get('engine_released'))} after it was released")
    print(f"  attention {num.get('attention_backends')}, sampler {num.get('topk_topp_sampler')}, "
          f"triton {num.get('triton')}, env {num.get('env')}")
PY
exit "$code"
