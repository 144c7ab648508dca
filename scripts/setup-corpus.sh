#!/usr/bin/env bash
# Unpack a public corpus of real-world image files for tests/test_corpus.py: Pillow's own test
# images (about a thousand files in every format Pillow reads, truncated, malformed and
# fuzzer-found files among them), from the source distribution of the Pillow installed in
# .venv, taken from the package registry like any other package (about 47 MB; the files stay
# under Pillow's licence, which the source distribution carries; nothing is committed here).
#
#   bash scripts/setup-corpus.sh      then  .venv/bin/python tests/image_corpus.py .corpus/pillow-*
#
# Part of the test command (README, .ci/run), not of scripts/setup.sh: only the tests read it.
# A rerun with the corpus in place does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VPY=${SPECEYES_VENV:-.venv}/bin/python
say() { echo "setup-corpus: $*"; }
VERSION=$("$VPY" -c 'import PIL; print(PIL.__version__)')
DEST=.corpus/pillow-$VERSION
if [ -f "$DEST/.complete" ]; then
  say "up to date ($DEST)"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
say "fetching the Pillow $VERSION source distribution for its test images"
"$VPY" -m pip download -q --no-binary :all: --no-deps --no-build-isolation "pillow==$VERSION" -d "$TMP" 2>/dev/null \
  || "$VPY" -m pip download -q --no-binary :all: --no-deps "pillow==$VERSION" -d "$TMP"
rm -rf "$DEST" && mkdir -p "$DEST"
tar -xzf "$TMP"/pillow-*.tar.gz -C "$TMP" --wildcards "*/Tests/images/*" "*/LICENSE"
cp -r "$TMP"/pillow-*/Tests/images/. "$DEST"/
cp "$TMP"/pillow-*/LICENSE "$DEST"/.LICENSE
touch "$DEST/.complete"
say "done: $(find "$DEST" -type f ! -name '.*' | wc -l) files in $DEST"
