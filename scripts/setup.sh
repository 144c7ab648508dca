#!/usr/bin/env bash
# Set up speceyes-graph in a project virtual environment (.venv), so it works with a stock
# Debian/Ubuntu Python (PEP 668 "externally managed": pip refuses to install into it).
#
#   bash scripts/setup.sh            then  .venv/bin/python -m speceyes_graph demo
#
# Installs Tesseract, Graphviz, bubblewrap and PostgreSQL (apt), python3-venv if venv is missing, PyTorch
# if the Python you set up from does not have it already (torch==2.14.1, torchvision==0.29.1,
# about 3.5 GB to download, 6 GB on disk; an existing install, e.g. your CUDA build, is
# reused through --system-site-packages), then this package with its dev extras, all with uv
# (scripts/uv.sh). A rerun with nothing changed takes about a second. Environment:
#   PYTHON=python3.12   the interpreter the environment is made from (default python3)
#   SPECEYES_VENV=DIR   where the environment lives (default .venv in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SPECEYES_VENV:-.venv}
VPY="$VENV/bin/python"
STAMP="$VENV/.speceyes-setup"
source scripts/uv.sh

say() { echo "setup: $*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else return 1; fi; }
apt_install() {
  command -v apt-get >/dev/null 2>&1 || return 1
  say "installing $* (apt)"
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "${APT_UPDATED:-}" ]; then as_root apt-get update -qq; APT_UPDATED=1; fi
  as_root apt-get install -y -qq "$@" >/dev/null
}

has_postgres() { command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; }

# What the stamp records: a rerun with the same inputs and a working environment is a no-op.
fingerprint() { cat pyproject.toml scripts/setup.sh scripts/uv.sh | sha256sum | cut -d' ' -f1; }
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ] \
   && command -v tesseract >/dev/null 2>&1 && command -v bwrap >/dev/null 2>&1 && has_postgres \
   && "$VPY" -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('torch', 'torchvision', 'speceyes_graph')))" >/dev/null 2>&1; then
  say "up to date ($VENV)"
  exit 0
fi

# Tesseract for the OCR tool (and its tests); Graphviz's `dot` for PNG workflow pictures;
# bubblewrap's `bwrap` for the code sandbox (model-written code never runs without it);
# PostgreSQL's server for the tests of shared checkpoints and blobs (a throwaway cluster).
if ! command -v tesseract >/dev/null 2>&1 || ! command -v dot >/dev/null 2>&1 \
   || ! command -v bwrap >/dev/null 2>&1 || ! has_postgres; then
  apt_install tesseract-ocr graphviz bubblewrap postgresql \
    || say "please install tesseract and bubblewrap (and optionally graphviz, postgresql) with your package manager" >&2
fi

if [ ! -x "$VPY" ]; then
  command -v "$PY" >/dev/null 2>&1 || { say "$PY not found; set PYTHON=/path/to/python3" >&2; exit 1; }
  say "creating $VENV from $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  if ! "$PY" -m venv --system-site-packages "$VENV" 2>/dev/null; then
    rm -rf "$VENV"  # Debian/Ubuntu ship venv (ensurepip) separately
    apt_install python3-venv || { say "cannot create a virtual environment: install python3-venv" >&2; exit 1; }
    "$PY" -m venv --system-site-packages "$VENV"
  fi
fi

UV_BIN=$(uv_for "$VPY")
uv_install() { "$UV_BIN" pip install -q --python "$VPY" "$@"; }

# PyTorch: reuse one the base Python already has (e.g. your CUDA build); else the pinned pair.
if ! "$VPY" -c "import torch, torchvision" >/dev/null 2>&1; then
  say "installing torch 2.14.1 and torchvision 0.29.1 (about 3.5 GB to download, 6 GB on disk)"
  uv_install "torch==2.14.1" "torchvision==0.29.1"
fi

# The fast OCR engine (tesserocr) ships binary wheels for common platforms; without one,
# the OCR tool falls back to pytesseract, so a failed install here is not an error.
say "installing speceyes-graph and its dev extras"
uv_install -e ".[dev,fast-ocr]" 2>/dev/null || uv_install -e ".[dev]"
fingerprint > "$STAMP"
say "done: $("$VPY" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")') in $VENV"
