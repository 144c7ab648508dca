# Sourced by the setup scripts: `uv_for PYTHON` prints the path of a uv to install into the
# environment of PYTHON with (`"$(uv_for "$VPY")" pip install --python "$VPY" ...`).
#
# uv (from the package registry, like pip) installs these environments in seconds where pip
# takes minutes (measured on 2 cores from nothing: SGLang's 9.5 GB in 45 s against 5.8 min,
# vLLM's in 21 s against 4.5 min): it downloads in parallel, links files out of its cache
# and does not byte-compile every module up front. $UV names one to use instead; otherwise
# uv on PATH, else the project environment's (scripts/setup.sh puts one there), else the one
# in that environment, installed there with pip if missing.
uv_for() {
  local python=$1 own project
  own="$(dirname "$python")/uv"
  project="${SPECEYES_VENV:-.venv}/bin/uv"
  if [ -n "${UV:-}" ]; then echo "$UV"
  elif command -v uv >/dev/null 2>&1; then command -v uv
  elif [ -x "$project" ]; then echo "$project"
  else
    [ -x "$own" ] || "$python" -m pip install -q "uv>=0.9" 2> >(grep -v "is ignored: it is neither" >&2)
    echo "$own"
  fi
}
