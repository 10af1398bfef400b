#!/usr/bin/env bash
# Set up everything tuned-rl needs on a fresh Debian 12 machine: Debian's BCC
# bindings and kernel headers, tracefs, and a virtual environment at .venv that
# sees the system's BCC (python3-bpfcc; PyPI's "bcc" is an unrelated package).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    if ! /usr/bin/python3 -c "import bcc, venv, ensurepip" 2>/dev/null || ! command -v hackbench >/dev/null \
        || ! ls -d /usr/src/linux-headers-*-amd64 >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            python3-bpfcc python3-venv linux-headers-amd64 rt-tests >/dev/null
    fi
    # Prometheus (Debian's) for the fleet lab, which starts its own server on a loopback port: the
    # package's own service is kept from starting (policy-rc.d), so nothing else listens afterwards.
    if ! command -v prometheus >/dev/null; then
        [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit)" ] || apt-get update -qq
        policy=/usr/sbin/policy-rc.d
        own_policy=
        if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1; fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
        [ -z "$own_policy" ] || rm -f "$policy"
    fi
    # BCC compiles against kernel headers; this VM kernel has no package of its
    # own, so point the module build links at Debian's. They belong to another build: tuned-rl's
    # programs read task_struct fields only at offsets the running kernel's BTF gives.
    kver=$(uname -r)
    if [ ! -e "/lib/modules/$kver/build/include" ]; then
        hdr=$(ls -d /usr/src/linux-headers-*-amd64 | sort -V | tail -n 1)
        mkdir -p "/lib/modules/$kver"
        ln -sfn "$hdr" "/lib/modules/$kver/build"
        ln -sfn "${hdr%-amd64}-common" "/lib/modules/$kver/source"
    fi
    mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing || true
fi

if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv --system-site-packages .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
