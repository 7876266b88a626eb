#!/usr/bin/env bash
# Rebuild the cffi extension in place for development, atomically: compile into a scratch directory, then rename
# over src/logbuf/_native.abi3.so, so processes that have the old library mapped keep running (an in-place copy
# would truncate pages they are executing). `./run setup` remains the way to install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
LOGBUF_NATIVE_ABSOLUTE=1 "$PY" - "$scratch" <<'PYEOF'
import runpy, sys
builder = runpy.run_path("native/build_native.py")["ffibuilder"]
builder.compile(tmpdir=sys.argv[1], verbose=False)
PYEOF
built=$(find "$scratch" -maxdepth 2 -name '_native*.so' | head -1)
target=src/logbuf/_native.abi3.so
cp "$built" "$target.new"
mv -f "$target.new" "$target"
echo "rebuilt $target"
