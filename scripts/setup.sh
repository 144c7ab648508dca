#!/usr/bin/env bash
# Set up speceyes-graph on a fresh machine: system packages, PyTorch, the package itself.
# Idempotent: what is already installed is left alone. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Tesseract for the OCR tool (and its tests); Graphviz's `dot` for PNG workflow pictures.
if ! command -v tesseract >/dev/null 2>&1 || ! command -v dot >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq tesseract-ocr graphviz >/dev/null
  else
    echo "setup: please install tesseract (and optionally graphviz) with your package manager" >&2
  fi
fi

# PyTorch: keep an existing install (e.g. your CUDA build); otherwise the pinned pair.
if ! "$PY" -c "import torch, torchvision" >/dev/null 2>&1; then
  "$PY" -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
fi

# The fast OCR engine (tesserocr) ships binary wheels for common platforms; without one,
# the OCR tool falls back to pytesseract, so a failed install here is not an error.
"$PY" -m pip install -q -e ".[dev,fast-ocr]" || "$PY" -m pip install -q -e ".[dev]"
echo "setup: done ($("$PY" -c 'import torch, transformers, langgraph; print(f"torch {torch.__version__}, transformers {transformers.__version__}")'))"
