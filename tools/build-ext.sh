#!/bin/sh
# Build upcall's extension modules with extra compiler flags (sanitizers,
# fuzzing instrumentation) into a private tree OUTDIR, next to a copy of the
# package's Python files, so that PYTHONPATH=OUTDIR imports them instead of
# the normal in-place build:
#
#   tools/build-ext.sh OUTDIR CC "CFLAGS..."
#
# Used by tools/sanitize-python.sh and fuzz/run.sh.  Rebuilds only when a
# source is newer than the last build in OUTDIR.
set -eu
out=$1; cc=$2; flags=$3
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-$root/.venv/bin/python}
cd "$root"
mkdir -p "$out/upcall"
stamp="$out/.built"
newer=$(find csrc upcall setup.py -newer "$stamp" \( -name '*.c' -o -name '*.h' -o -name '*.pyx' \
        -o -name '*.pxi' -o -name '*.pxd' -o -name '*.py' \) 2>/dev/null | head -1 || true)
if [ -f "$stamp" ] && [ -z "$newer" ] && [ "$(cat "$stamp")" = "$cc $flags" ]; then
    exit 0
fi
echo "== building the extension modules into $out with $cc $flags"
# The package's Python side, so that `import upcall` finds the .so files here.
rm -rf "$out/upcall"
mkdir -p "$out/upcall"
cp upcall/*.py upcall/*.pyi "$out/upcall/" 2>/dev/null || true
for d in upcall/*/; do
    case "$d" in *__pycache__*) continue ;; esac
    mkdir -p "$out/$d" && cp "$d"*.py "$out/$d" 2>/dev/null || true
done
CC="$cc" LDSHARED="$cc -shared" CFLAGS="$flags" LDFLAGS="$flags" \
    "$py" setup.py -q build_ext --build-lib "$out" --build-temp "$out/tmp" --force
echo "$cc $flags" > "$stamp"
