#!/bin/sh
# An older Linux distribution root to install the portable wheels in
# (tests/test_portable_wheels.py); prints its path.
#
#   tools/older-root.sh
#
# Debian 11 "bullseye" (glibc 2.31), made with debootstrap: the oldest Debian
# that deb.debian.org still serves (buster's glibc 2.28 lives on
# archive.debian.org, which is not reachable here).  Bullseye's own Python is
# 3.9, older than upcall supports, and the pyenv interpreters of this machine
# need glibc 2.35; so the root gets a CPython 3.11 built from Debian's
# source package (python3.11, bookworm) with `zig cc -target
# x86_64-linux-gnu.2.28`, installed in /opt/python3.11.  It has the modules
# that need nothing outside libc (no ssl, ctypes, zlib: the wheel is unpacked
# by the host's pip), which is all upcall needs.
#
# Cached in UPCALL_PORTABLE_CACHE (default ~/.cache/upcall-portable), next to
# the toolchain tools/build-portable-wheels.sh sets up (run that first: it
# provides the zig wrappers).  Needs root (debootstrap).
set -eu
cache=${UPCALL_PORTABLE_CACHE:-$HOME/.cache/upcall-portable}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
rootfs=$cache/bullseye-root
jobs=${JOBS:-2}
log() { echo "older-root: $*" >&2; }
[ -x "$cache/bin/zig-cc" ] || { log "no zig wrappers in $cache/bin: run tools/build-portable-wheels.sh first"; exit 1; }

if [ ! -x "$rootfs/bin/sh" ]; then
    command -v debootstrap >/dev/null 2>&1 || {
        log "installing debootstrap with apt-get"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    log "debootstrap bullseye (minbase) into $rootfs"
    rm -rf "$rootfs.tmp"
    debootstrap --variant=minbase bullseye "$rootfs.tmp" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 \
        || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    mv "$rootfs.tmp" "$rootfs"
fi

py=$rootfs/opt/python3.11/bin/python3.11
if [ ! -x "$py" ]; then
    src=$cache/src
    if ! ls "$src"/python3.11_*.orig.tar.* >/dev/null 2>&1; then
        mkdir -p "$src" "$cache/apt/lists/partial"
        echo "deb-src http://deb.debian.org/debian bookworm main" > "$cache/apt/sources.list"
        APT="-o Dir::Etc::SourceList=$cache/apt/sources.list -o Dir::Etc::SourceParts=/dev/null
             -o Dir::State::Lists=$cache/apt/lists -o Debug::NoLocking=1 -o APT::Sandbox::User=root"
        apt-get $APT update -qq
        log "fetching the source package python3.11"
        (cd "$src" && apt-get $APT source --download-only -qq python3.11 2>/dev/null)
    fi
    b=$cache/pybuild
    rm -rf "$b" && mkdir -p "$b"
    tar -xf "$(ls "$src"/python3.11_*.orig.tar.* | head -1)" -C "$b"
    d=$(ls -d "$b"/Python-3.11*/ | head -1)
    # setup.py adds the host's /usr/include/<multiarch>, whose glibc headers
    # clash with zig's (every extension module fails): not for this build.
    sed -i 's/^    def add_multiarch_paths(self):$/&\n        return/' "$d/setup.py"
    log "building CPython 3.11 for glibc 2.28 with zig (a few minutes)"
    # -Wno-date-time: zig makes __DATE__ (getbuildinfo.c) an error.
    (cd "$d" && ./configure -q CC="$cache/bin/zig-cc" AR="$cache/bin/zig-ar" CFLAGS="-Wno-date-time" \
                 --prefix=/opt/python3.11 --without-ensurepip --disable-test-modules \
               && make -s -j"$jobs" && make -s install DESTDIR="$rootfs") >"$b.log" 2>&1 \
        || { tail -30 "$b.log" >&2; exit 1; }
fi
echo "$rootfs"
