#!/usr/bin/env bash
# Rebuild both native modules in place for development, atomically: compile into a scratch directory, then
# rename over src/logbuf/_native<EXT_SUFFIX> and src/logbuf/_client<EXT_SUFFIX>, so processes that have the old
# libraries mapped keep running (an in-place copy would truncate pages they are executing).
# `./run setup` remains the way to install.  Extra compiler/linker flags: LOGBUF_NATIVE_CFLAGS/_LDFLAGS.
# With OUT=<dir>, the modules go to <dir>/logbuf/ instead of src/logbuf/ (scripts/build-sanitized.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
out=${OUT:-src}/logbuf
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
LOGBUF_NATIVE_ABSOLUTE=1 "$PY" - "$scratch" <<'PYEOF'
import runpy, sys
from setuptools import Distribution
from setuptools.command.build_ext import build_ext

scratch = sys.argv[1]
module = runpy.run_path("native/build_native.py")
module["ffibuilder"].compile(tmpdir=scratch, verbose=False)
cmd = build_ext(Distribution({"ext_modules": [module["client_extension"]()]}))
cmd.build_lib = scratch
cmd.build_temp = scratch + "/tmp"
cmd.ensure_finalized()
cmd.run()
PYEOF
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
for name in _native _client; do
    built=$(find "$scratch" -maxdepth 3 -name "$name*.so" | head -1)
    target="$out/$name$suffix"
    cp "$built" "$target.new"
    mv -f "$target.new" "$target"
    echo "rebuilt $target"
done
# the cffi module used to be built for the limited API: a stale copy would only confuse
rm -f "$out/_native.abi3.so"
