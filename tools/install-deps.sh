#!/bin/sh
# The system packages `make test` and `make bench` need, installed once.
#
#   tools/install-deps.sh [PYTHON]
#
# Checks for each thing by what uses it (pkg-config for the libraries, the
# command for the tools, the interpreter for its headers and venv), collects
# the Debian packages of everything missing, and installs them with ONE
# `apt-get update` and ONE `apt-get install` (with sudo when not root).
# Nothing to do when everything is there: a machine set up by hand, or not
# Debian, passes without apt-get.  Run by the Makefile's .deps.stamp before
# anything else starts (two apt-gets at once fail on dpkg's lock).
#
# The list here is the one definition of what a machine needs beyond what
# README.md says to have before `make` (make, git, ca-certificates).
set -eu
python=${1:-python3}
missing=""
need() { missing="$missing $1"; echo "install-deps: $2: needs $1" >&2; }

command -v cc >/dev/null 2>&1 || need "gcc libc6-dev" "no C compiler (cc)"
command -v pkg-config >/dev/null 2>&1 || need pkg-config "no pkg-config"
# pkg-config name:Debian package.  libzmq is required; the codecs' libraries
# are optional for a build but the tests use every codec: their pairs come
# from the codec lines of meson.options ("pkg-config X, Debian Y").
codecs=$(sed -n "s/^option('.*compression codec: pkg-config \([^,]*\), Debian \([^']*\)').*/\1:\2/p" \
    "$(dirname "$0")/../meson.options")
for pair in libzmq:libzmq3-dev $codecs; do
    pc=${pair%%:*}; deb=${pair#*:}
    pkg-config --exists "$pc" 2>/dev/null || need "$deb" "pkg-config cannot find $pc"
done
if command -v "$python" >/dev/null 2>&1; then
    "$python" -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
        2>/dev/null || need python3-dev "no Python.h for $python"
    # Debian's python3 has venv without ensurepip until python3-venv is installed.
    "$python" -c 'import ensurepip, venv' 2>/dev/null || need python3-venv "$python cannot make a venv with pip"
else
    need "python3-dev python3-venv" "no $python"
fi
# Network-namespace tests (tests/bus/test_netns.py) and firewall rules for
# the cluster tests.
command -v ip >/dev/null 2>&1 || need iproute2 "no ip"
command -v nft >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v nft >/dev/null 2>&1 || need nftables "no nft"

[ -z "$missing" ] && exit 0
if [ -n "${UPCALL_DEPS_INSTALLED:-}" ]; then
    echo "install-deps: still missing after apt-get install:$missing" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: no apt-get here: install the equivalents of:$missing" >&2
    exit 1
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
echo "install-deps: apt-get install$missing" >&2
$sudo apt-get update -qq
# shellcheck disable=SC2086 # one word per package
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "install-deps: installed$missing" >&2
# Once more, to check that what was installed provides what was missing.
UPCALL_DEPS_INSTALLED=1 exec "$0" "$python"
