#!/usr/bin/env bash
# Build dist/tuned-rl_VERSION_all.deb: tuned-rl for Debian's own Python 3, depending on Debian's
# packages (python3-bpfcc, python3-pluggy, ...), so a node needs no virtual environment:
#     bash packaging/debian/build.sh && apt-get install ./dist/tuned-rl_*_all.deb
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
python=${PYTHON:-python3}
# The packages and their metadata (entry points: the built-in plugins load through them, as any
# third-party plugin does), without dependencies: Debian provides those.
"$python" -m pip install -q --no-deps --no-compile --no-warn-script-location \
    --target "$stage/usr/lib/python3/dist-packages" .
rm -rf "$stage/usr/lib/python3/dist-packages/bin"
install -d "$stage/usr/bin" "$stage/lib/systemd/system" "$stage/etc/tuned-rl" "$stage/usr/share/doc/tuned-rl/profiles" \
    "$stage/DEBIAN"
cat > "$stage/usr/bin/tuned-rl" <<'SCRIPT'
#!/usr/bin/python3
import sys

from tuned_rl.cli import main

sys.exit(main())
SCRIPT
chmod 755 "$stage/usr/bin/tuned-rl"
install -m 644 packaging/systemd/tuned-rl.service "$stage/lib/systemd/system/tuned-rl.service"
install -m 644 profiles/*.toml "$stage/usr/share/doc/tuned-rl/profiles/"
install -m 644 README.md "$stage/usr/share/doc/tuned-rl/README.md"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: tuned-rl
Version: $version
Architecture: all
Maintainer: tuned-rl developers <tuned-rl@localhost>
Depends: python3 (>= 3.9), python3-bpfcc, python3-pluggy, python3-psutil, python3-pyroute2, python3-numpy, python3-prometheus-client, python3-tomli | python3 (>= 3.11)
Recommends: linux-headers-amd64 | linux-headers-arm64
Section: admin
Priority: optional
Description: tune a host for a latency-critical workload, one verified, undoable step at a time
 Applies a profile's tuning steps (RT budgets, sysctls, CPU and IRQ isolation, NUMA binding,
 offline-job eviction, SCHED_FIFO removal), measures the workload's run-queue latency before
 and after each with eBPF, reverts any step that makes p999 worse, and journals every change
 durably so that "tuned-rl rollback" restores the host even after a crash.
CONTROL
cat > "$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
# The unit is installed, not enabled: put a profile at /etc/tuned-rl/profile.toml, then
# systemctl enable tuned-rl.service
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
POSTINST
chmod 755 "$stage/DEBIAN/postinst"
mkdir -p dist
dpkg-deb --root-owner-group --build "$stage" "dist/tuned-rl_${version}_all.deb" >/dev/null
echo "dist/tuned-rl_${version}_all.deb"
