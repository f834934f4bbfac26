#!/bin/sh
# Build a variant of upcall (sanitizers, fuzzing instrumentation) from the one
# meson.build, in a build directory of its own, and lay out a package tree
# that PYTHONPATH can import instead of the editable install:
#
#   tools/build-ext.sh VARIANT      asan | tsan | fuzz
#
#   build/VARIANT      the meson build directory: the extension modules, and
#                      the C tests (meson test -C build/VARIANT) or, for fuzz,
#                      the libFuzzer harnesses (build/fuzz/csrc/fuzz/)
#   build/VARIANT-py   upcall's Python files and the variant's modules
#
# Prints the shell assignment MESONPY_EDITABLE_SKIP=... that a run under
# PYTHONPATH=build/VARIANT-py needs: it turns the editable install's import
# hook off (it comes before PYTHONPATH otherwise), in child interpreters too.
# Used by `make sanitize`, tools/sanitize-python.sh, `make fuzz` and fuzz/run.sh.
set -eu
variant=$1
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-$root/.venv/bin/python}
bin=$(dirname "$py")
cd "$root"
# Sanitized code at -O1 with frame pointers: readable reports, bounded cost.
common="-Dbuildtype=debug -Doptimization=1 -Db_lundef=false"
case "$variant" in
    asan) cc=${CC:-gcc}; opts="$common -Db_sanitize=address,undefined"; cargs="-fno-omit-frame-pointer" ;;
    tsan) cc=${CC:-gcc}; opts="$common -Db_sanitize=thread"; cargs="-fno-omit-frame-pointer" ;;
    # libFuzzer's coverage on the core and the modules; the harnesses link -fsanitize=fuzzer.
    fuzz) cc=clang; opts="$common -Db_sanitize=address,undefined -Dfuzzers=true"
          cargs="-fno-omit-frame-pointer -fsanitize=fuzzer-no-link" ;;
    *) echo "build-ext.sh: VARIANT is asan, tsan or fuzz, not $variant" >&2; exit 2 ;;
esac
dir=build/$variant
out=build/$variant-py
# The Cython and meson of .venv, whatever PATH says.
export PATH="$bin:$PATH"
if [ -f "$dir/build.ninja" ]; then
    "$bin/meson" configure "$dir" $opts "-Dc_args=$cargs" >/dev/null
else
    # The interpreter and Cython by absolute path: a rebuild finds them
    # whatever PATH it runs with.
    mkdir -p build
    printf "[binaries]\npython = '%s'\ncython = '%s'\n" "$py" "$bin/cython" > "build/$variant.ini"
    CC=$cc "$bin/meson" setup "$dir" $opts "-Dc_args=$cargs" --native-file "build/$variant.ini" >&2
fi
echo "== building upcall ($variant) in $dir" >&2
nice "$bin/meson" compile -C "$dir" >&2
# The package: its Python files as they are, the variant's modules.
rm -rf "$out"
mkdir -p "$out/upcall/includes"
cp upcall/*.py upcall/*.pyi upcall/py.typed "$out/upcall/"
cp upcall/includes/*.py "$out/upcall/includes/"
for so in "$dir"/upcall/*.so; do ln -s "$root/$so" "$out/upcall/"; done
skip=$("$py" -c 'import sys; print(":".join(f._build_path for f in sys.meta_path if hasattr(f, "_build_path")))')
echo "MESONPY_EDITABLE_SKIP=$skip"
