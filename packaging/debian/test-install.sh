#!/usr/bin/env bash
# Build the .deb, install it with apt (Debian's dependencies come with it), check that
# /usr/bin/tuned-rl runs (doctor, plugins) under Debian's Python, then remove it again.
set -euo pipefail
cd "$(dirname "$0")/../.."
deb=$(PYTHON=.venv/bin/python bash packaging/debian/build.sh)
trap 'DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq tuned-rl >/dev/null 2>&1 || true' EXIT
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$deb" >/dev/null
test -x /usr/bin/tuned-rl
cd /   # nothing from the checkout on sys.path
/usr/bin/tuned-rl doctor --json > /tmp/tuned-rl-deb-doctor.json || true   # exit 1 only if no probe can run
/usr/bin/python3 -c "import json; d = json.load(open('/tmp/tuned-rl-deb-doctor.json')); assert d['facts']['root'], d; print('doctor from /usr/bin: auto probe', d['auto'])"
/usr/bin/tuned-rl plugins --json | /usr/bin/python3 -c "
import json, sys
names = {p['name'] for p in json.load(sys.stdin)['plugins']}
wanted = {'cpu_isolation', 'irq_isolation', 'numa', 'offline_eviction', 'rt_runtime', 'sched_fifo', 'sysctl'}
assert wanted <= names, names
print('plugins from /usr/bin:', ', '.join(sorted(names)))"
/usr/bin/tuned-rl apply /usr/share/doc/tuned-rl/profiles/rl-inference.toml --dry-run > /dev/null
echo "the .deb installs and runs"
