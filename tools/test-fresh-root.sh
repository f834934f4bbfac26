#!/bin/sh
# The two commands on a machine that has never seen upcall: `make test` and
# `make bench BENCH_ARGS=--quick` in a fresh Debian 12 "bookworm" root that
# holds only what README.md says a machine needs before `make` (make, git,
# ca-certificates); the Makefile installs everything else.
#
#   tools/test-fresh-root.sh          (make test-fresh-root)
#
# The root is made with debootstrap (minbase) once and kept as a tarball in
# UPCALL_FRESH_CACHE (default ~/.cache/upcall-fresh-root); every run unpacks
# it into a new directory, so no run sees what another installed.  The tree
# is cloned into the root from this checkout's committed HEAD (what a
# newcomer's `git clone` gets; uncommitted changes are not in it).
#
# Inside: no pyenv, so `make test`'s matrix of other CPythons (make
# test-threads-all) has no interpreter and runs nothing; the root's own
# python3 (3.11) runs the main suite.  Needs root (debootstrap, chroot,
# mounts); /proc, /sys, /dev, /dev/pts and /dev/shm are mounted in a private
# mount namespace and unmounted on any exit.  Set UPCALL_FRESH_KEEP=1 to keep
# the unpacked root for a look afterwards (its path is printed).
set -eu
[ "$(id -u)" = 0 ] || { echo "test-fresh-root: needs root (debootstrap, chroot, mount)" >&2; exit 1; }
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${UPCALL_FRESH_CACHE:-$HOME/.cache/upcall-fresh-root}
suite=bookworm
mirror=${UPCALL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What README.md's "Before `make`" names: the one list a machine needs.
prerequisites=make,git,ca-certificates
tarball=$cache/$suite-minbase.tar.gz
log() { echo "test-fresh-root: $*" >&2; }
mkdir -p "$cache"

if [ ! -s "$tarball" ] || [ "$(cat "$tarball.prerequisites" 2>/dev/null)" != "$prerequisites" ]; then
    command -v debootstrap >/dev/null 2>&1 || {
        log "installing debootstrap with apt-get"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    made=$(mktemp -d /var/tmp/upcall-debootstrap.XXXXXX)
    log "debootstrap $suite (minbase + $prerequisites) into $made"
    debootstrap --variant=minbase --include="$prerequisites" "$suite" "$made" "$mirror" \
        >"$cache/debootstrap.log" 2>&1 || { tail -20 "$cache/debootstrap.log" >&2; rm -rf "$made"; exit 1; }
    rm -rf "$made/var/cache/apt/archives/"*.deb
    tar -C "$made" -czf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    echo "$prerequisites" > "$tarball.prerequisites"
    rm -rf "$made"
fi

root=$(mktemp -d /var/tmp/upcall-fresh-root.XXXXXX)
cleanup() {
    if [ -z "${UPCALL_FRESH_KEEP:-}" ]; then rm -rf --one-file-system "$root"; else log "kept $root"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log "unpacking $tarball into $root"
tar -C "$root" -xzf "$tarball"
chmod 755 "$root"       # mktemp's 0700 (kept in the tarball) would keep apt's _apt user out
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/src"
# How this machine reaches PyPI, carried in: a CA bundle pip is told to
# trust (PIP_CERT, as where TLS goes through an inspecting proxy), an index,
# proxies.  Network settings of this machine, not prerequisites: a
# newcomer's machine has its own.
pass_env=""
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
    cp "$PIP_CERT" "$root/etc/upcall-host-ca.crt"
    pass_env="PIP_CERT=/etc/upcall-host-ca.crt"
fi
for v in PIP_INDEX_URL PIP_DEFAULT_TIMEOUT http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    eval "val=\${$v:-}"
    if [ -n "$val" ]; then pass_env="$pass_env $v=$val"; fi
done

# The run inside, as a newcomer types it, timed.
cat > "$root/root/fresh-run.sh" <<'EOF'
set -eu
cd /root
git clone -q /src upcall
cd upcall
echo "== git: $(git log -1 --format='%h %s')"
echo "== python3 before make: $(command -v python3 || echo none)"
echo "== pyenv: none in this root, so make test-threads-all (the other CPythons) runs nothing"
start=$(date +%s)
test_rc=0; make test || test_rc=$?
mid=$(date +%s)
bench_rc=0; make bench BENCH_ARGS=--quick || bench_rc=$?
end=$(date +%s)
echo "== make test: status $test_rc, $((mid - start)) s; make bench BENCH_ARGS=--quick: status $bench_rc, $((end - mid)) s"
[ "$test_rc" = 0 ] && [ "$bench_rc" = 0 ]
EOF

# In a private mount namespace (unshare: its mounts are private, nothing
# propagates back to this machine's /dev or /proc, and the kernel takes them
# down with the namespace), unmounted on any exit all the same.
unshare --mount --fork sh -eu -c '
r=$1; src=$2
mounted=""
umount_all() { for m in $mounted; do umount -l "$m" 2>/dev/null || true; done; }
trap umount_all EXIT
trap "exit 130" INT TERM
m() { target=$1; shift; mount "$@" "$target"; mounted="$target $mounted"; }
# The root a mount point of its own, as / is on a machine: `ip netns`
# makes / a slave mount ("mount --make-rslave /"), which fails on a plain
# directory.
m "$r" --bind "$r"
m "$r/proc" -t proc proc
m "$r/sys" --rbind /sys
m "$r/dev" --bind /dev
m "$r/dev/pts" --bind /dev/pts
m "$r/dev/shm" -t tmpfs -o mode=1777 tmpfs
m "$r/src" --bind -o ro "$src"
# shellcheck disable=SC2086 # pass_env: one word per setting
chroot "$r" env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin $3 \
    sh /root/fresh-run.sh
' sh "$root" "$here" "$pass_env"
