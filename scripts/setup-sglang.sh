#!/usr/bin/env bash
# Set up SGLang in a virtual environment of its own (.venv-sglang), for the served-path tests
# against a second engine (pytest -m sglang).
#
#   bash scripts/setup-sglang.sh
#
# SGLang 0.5.23 brings torch 2.14.1 with the CUDA libraries (about 11 GB; it runs on a CPU).
# On a CPU, SGLang's own CPU engine needs a CPU build of sgl-kernel that the package registry
# does not carry, so the tests run it without that engine (--device cpu), where it imports one
# vLLM kernel it never calls for the Qwen-VL models: scripts/sglang_cpu stands in for that
# import (and raises if it is ever called); SGLangServer puts it on PYTHONPATH. Installed with
# uv (scripts/uv.sh). Measured on a 2-core machine: about 45 seconds and 9.5 GB from nothing
# (pip took 5.8 minutes); a rerun with everything installed takes seconds. Environment:
#   PYTHON=python3.12        the interpreter the environment is made from (default python3)
#   SPECEYES_SGLANG_VENV=DIR where it lives (default .venv-sglang in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SPECEYES_SGLANG_VENV:-.venv-sglang}
VPY="$VENV/bin/python"
STAMP="$VENV/.speceyes-setup"
source scripts/uv.sh
SGLANG=sglang==0.5.23

say() { echo "setup-sglang: $*"; }
fingerprint() { cat scripts/setup-sglang.sh scripts/uv.sh | sha256sum | cut -d' ' -f1; }
works() {
  "$VPY" -c "import importlib.metadata as m, sglang; assert m.version('sglang') == '0.5.23'" \
    >/dev/null 2>&1
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
say "installing $SGLANG (9.5 GB)"
"$(uv_for "$VPY")" pip install -q --python "$VPY" "$SGLANG"
works || { say "SGLang does not import in $VENV; see the messages above" >&2; exit 1; }
fingerprint > "$STAMP"
say "done: sglang $("$VPY" -c 'import importlib.metadata as m; print(m.version("sglang"))') in $VENV"
