#!/usr/bin/env bash
# Rebuild the native code in place for development, atomically: compile into a scratch directory, then rename
# over src/logbuf/liblogbuf-core.so, src/logbuf/_native<EXT_SUFFIX> and src/logbuf/_client<EXT_SUFFIX>, so
# processes that have the old libraries mapped keep running (an in-place copy would truncate pages they are
# executing).  The modules find the core library beside them (run path $ORIGIN).
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

scratch = sys.argv[1]
module = runpy.run_path("native/build_native.py")
cffi_extension = module["ffibuilder"].distutils_extension(tmpdir=scratch + "/src", verbose=False)
cmd = module["BuildNative"](Distribution({"ext_modules": [module["client_extension"](), cffi_extension]}))
cmd.build_lib = scratch
cmd.build_temp = scratch + "/tmp"
cmd.ensure_finalized()
cmd.run()
PYEOF
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
# the core first: a module is never in place before the library it links
core=$(find "$scratch" -maxdepth 3 -name liblogbuf-core.so | head -1)
cp "$core" "$out/liblogbuf-core.so.new"
mv -f "$out/liblogbuf-core.so.new" "$out/liblogbuf-core.so"
echo "rebuilt $out/liblogbuf-core.so"
for name in _native _client; do
    built=$(find "$scratch" -maxdepth 3 -name "$name*.so" | head -1)
    target="$out/$name$suffix"
    cp "$built" "$target.new"
    mv -f "$target.new" "$target"
    echo "rebuilt $target"
done
# the cffi module used to be built for the limited API: a stale copy would only confuse
rm -f "$out/_native.abi3.so"
