#!/usr/bin/env bash
# Builds logbuf._native and logbuf._client with AddressSanitizer + UndefinedBehaviorSanitizer into a scratch
# directory (default: a new temporary one) and prints the environment that selects them:
#
#   eval "$(scripts/build-sanitized.sh)"     # exports LOGBUF_NATIVE_DIR, LD_PRELOAD, ASAN_OPTIONS, UBSAN_OPTIONS
#   python -m pytest tests/test_properties.py tests/native
#
# logbuf.native imports the native modules from $LOGBUF_NATIVE_DIR/logbuf when it is set.  Python itself is
# not instrumented, so libasan is preloaded and PYTHONMALLOC=malloc lets ASan see its heap; leak detection is
# off (the interpreter keeps memory on purpose).  Shared-memory mappings are not ASan-poisoned: there the
# checks are the hostile-input tests, and an access outside every mapping still faults (and is reported).
# Any out-of-bounds access or undefined behaviour (e.g. a signed shift of a negative value) aborts the process.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
dir=${1:-$(mktemp -d -t logbuf-sanitized.XXXXXX)}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
OUT="$dir" PY="$PY" LOGBUF_NATIVE_CFLAGS="$flags -O1" LOGBUF_NATIVE_LDFLAGS="-fsanitize=address,undefined" \
    bash scripts/rebuild-native.sh >&2
libasan=$(${CC:-gcc} -print-file-name=libasan.so)
echo "export LOGBUF_NATIVE_DIR='$dir'"
echo "export LD_PRELOAD='$libasan'"
echo "export ASAN_OPTIONS='detect_leaks=0:abort_on_error=1'"
echo "export UBSAN_OPTIONS='print_stacktrace=1:halt_on_error=1'"
# Python's own allocator is invisible to ASan: route it through malloc so heap buffers are checked too
echo "export PYTHONMALLOC=malloc"
