#!/usr/bin/env bash
# The Debian package, as an operator meets it (run as root by CI, from a checkout set up by
# tools/setup.sh): built with dpkg-buildpackage, lintian clean (no error, no warning), a first
# Ansible --check --diff on this node before tuned-rl is installed, installed with apt, run from
# /usr/bin (doctor, plugins, a dry run of a shipped profile, man 8 tuned-rl), then purged: nothing
# it installed or compiled is left, and the checkout's virtual environment still imports tuned-rl.
set -euo pipefail
cd "$(dirname "$0")/../.."
checkout=$(pwd)
export DEBIAN_FRONTEND=noninteractive
system_path=/usr/sbin:/usr/bin:/sbin:/bin

say() { echo "test-install: $*"; }
fail() { echo "test-install: FAILED: $*" >&2; exit 1; }

build_deps="debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools lintian man-db"
missing=$(for package in $build_deps; do
    dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || echo "$package"
done)
if [ -n "$missing" ]; then
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq $missing >/dev/null
fi
if dpkg-query -W -f '${Status}' tuned-rl 2>/dev/null | grep -q "installed"; then
    fail "tuned-rl is installed already: this test needs a node without it (apt-get purge tuned-rl)"
fi

deb=$(bash packaging/debian/build.sh | tail -n 1)
say "built $deb with dpkg-buildpackage"
changes=${deb%_all.deb}_$(dpkg --print-architecture).changes
# (lintian's "running with root privileges is not recommended" is said of CI's root, not of the package)
lint=$(env PATH="$system_path" lintian --fail-on error,warning "$changes" 2>&1) && linted=0 || linted=$?
grep -v "running with root privileges" <<< "$lint" || true
[ "$linted" = 0 ] || fail "lintian found errors or warnings in $changes"
say "lintian: no error, no warning ($changes)"

# A fleet operator's first look, before the roll-out: the role in check mode on a node without tuned-rl,
# with a harmful profile (the RT budget halved): the diff shows this node's live value and the planned one,
# from the package's own dry run, unpacked to a temporary directory that is gone afterwards.
play=$(mktemp -d)
trap 'rm -rf "$play"; apt-get purge -y -qq tuned-rl >/dev/null 2>&1 || true' EXIT
rt_runtime=$(cat /proc/sys/kernel/sched_rt_runtime_us)
printf '[profile]\nname = "rt-budget-halved"\n\n[sysctl]\n"kernel.sched_rt_runtime_us" = 500000\n' > "$play/rt.toml"
unpacked_before=$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name '*.tuned-rl-check' | wc -l)
cat > "$play/play.yml" <<PLAY
- name: The tuned_rl role, checked on a node without tuned-rl
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    tuned_rl_install: deb
    tuned_rl_deb: $checkout/$deb
    tuned_rl_profile_src: $play/rt.toml
    tuned_rl_profile_path: $play/profile.toml
    tuned_rl_state_dir: $play/state
    tuned_rl_defaults_file: $play/default
  roles:
    - tuned_rl
PLAY
check_mode() {
    env PATH="$system_path" ANSIBLE_ROLES_PATH="$checkout/packaging/ansible/roles" ANSIBLE_NOCOLOR=1 \
        ANSIBLE_LOCALHOST_WARNING=false ANSIBLE_INVENTORY_UNPARSED_WARNING=false \
        ANSIBLE_PYTHON_INTERPRETER="$checkout/.venv/bin/python" \
        "$checkout/.venv/bin/ansible-playbook" -i localhost, --check --diff "$play/play.yml" > "$play/check.log" 2>&1 \
        || { tail -n 40 "$play/check.log" >&2; fail "ansible-playbook --check --diff exited non-zero"; }
}
# The package's Python dependencies (python3-pluggy, ...) that this node's Debian Python lacks (a fresh
# node lacks some): check mode fetches them with apt-get download and unpacks them beside the package,
# installing none of them.
lacking=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | grep -v '|' | sed -E 's/^ *([^ |]+).*/\1/' | grep '^python3-' | while read -r package; do
    dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || echo "$package"
done | tr '\n' ' ' | sed 's/ $//')
check_mode
recap=$(grep -E "^localhost +:" "$play/check.log")
grep -qE "changed=[1-9]" <<< "$recap" && grep -q "failed=0" <<< "$recap" \
    || { cat "$play/check.log" >&2; fail "check mode did not report changed, or failed: $recap"; }
grep -q "would be copied to /var/cache/tuned-rl.deb and installed with apt" "$play/check.log" \
    || fail "check mode did not say what it would install"
grep -qx -- "-/proc/sys/kernel/sched_rt_runtime_us = $rt_runtime" "$play/check.log" \
    && grep -qx -- "+/proc/sys/kernel/sched_rt_runtime_us = 500000" "$play/check.log" \
    || { cp "$play/check.log" /tmp/tuned-rl-check.log;
         fail "check mode's diff did not show live $rt_runtime -> planned 500000 (/tmp/tuned-rl-check.log)"; }
[ ! -e /var/cache/tuned-rl.deb ] && [ ! -e "$play/profile.toml" ] && ! dpkg-query -W tuned-rl >/dev/null 2>&1 \
    && [ "$(cat /proc/sys/kernel/sched_rt_runtime_us)" = "$rt_runtime" ] \
    || fail "check mode changed the node"
for package in $lacking; do
    ! dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || fail "check mode installed $package"
done
[ "$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name '*.tuned-rl-check' | wc -l)" = "$unpacked_before" ] \
    || fail "check mode left its unpacked package behind"
say "ansible-playbook --check --diff before tuned-rl is installed: exit 0, ${recap#*: }; live $rt_runtime -> planned 500000${lacking:+ (lacking $lacking: fetched, unpacked, none installed)}"

installed_packages() { dpkg-query -W -f '${Package} ${Status}\n' | awk '$NF == "installed" {print $1}' | sort; }
installed_before=$(installed_packages)
apt-get install -y -qq "./$deb" >/dev/null
files=$(dpkg-query -L tuned-rl)
test -x /usr/bin/tuned-rl
compiled=$(find /usr/lib/python3/dist-packages/tuned_rl -name "*.pyc" | wc -l)
[ "$compiled" -gt 0 ] || fail "nothing was byte-compiled on install (py3compile)"
[ "$(systemctl is-enabled tuned-rl.service 2>/dev/null || true)" = disabled ] \
    || fail "tuned-rl.service should be installed and not enabled: $(systemctl is-enabled tuned-rl.service 2>&1)"
cd /   # nothing from the checkout on sys.path
/usr/bin/tuned-rl doctor --json > "$play/doctor.json" || true   # exit 1 only if no probe can run
/usr/bin/python3 -c "import json, sys; d = json.load(open(sys.argv[1])); assert d['facts']['root'], d; print('test-install: doctor from /usr/bin: auto probe', d['auto'])" "$play/doctor.json"
/usr/bin/tuned-rl plugins --json | /usr/bin/python3 -c "
import json, sys
names = {p['name'] for p in json.load(sys.stdin)['plugins']}
wanted = {'cpu_isolation', 'cpuidle', 'irq_isolation', 'numa', 'offline_eviction', 'rt_runtime', 'sched_fifo', 'sysctl'}
assert wanted <= names, names
print('test-install: plugins from /usr/bin:', ', '.join(sorted(names)))"
/usr/bin/tuned-rl apply /usr/share/tuned-rl/profiles/rl-inference.toml --dry-run > /dev/null
MANPAGER=cat MANWIDTH=80 man 8 tuned-rl 2>&1 | grep -q "^EXIT STATUS" || fail "man 8 tuned-rl shows no page"
say "installed: /usr/bin/tuned-rl runs, $compiled modules byte-compiled, the unit installed (disabled), man 8 tuned-rl"

# Removal rolls the tuning back (prerm), and purge removes the state directory once it is empty.
ratelimit=$(cat /proc/sys/kernel/printk_ratelimit)
printf '[profile]\nname = "purge-test"\n\n[sysctl]\n"kernel.printk_ratelimit" = %s\n' $((ratelimit + 1)) > "$play/purge.toml"
/usr/bin/tuned-rl apply "$play/purge.toml" --no-verify > /dev/null
[ "$(cat /proc/sys/kernel/printk_ratelimit)" = $((ratelimit + 1)) ] || fail "the purge test's apply changed nothing"
apt-get purge -y -qq tuned-rl > "$play/purge.log" 2>&1 || { cat "$play/purge.log" >&2; fail "apt-get purge failed"; }
[ "$(cat /proc/sys/kernel/printk_ratelimit)" = "$ratelimit" ] \
    || fail "removal left kernel.printk_ratelimit at $(cat /proc/sys/kernel/printk_ratelimit), not $ratelimit"
[ ! -e /var/lib/tuned-rl ] || fail "purge left /var/lib/tuned-rl: $(ls -R /var/lib/tuned-rl)"
say "removed: the applied profile was rolled back (prerm), and purge removed /var/lib/tuned-rl"
left=""
while IFS= read -r path; do
    if [ ! -d "$path" ] && { [ -f "$path" ] || [ -L "$path" ]; }; then left+=" $path"; fi   # /lib: usr-merge's link
done <<< "$files"
for path in /usr/lib/python3/dist-packages/tuned_rl /usr/lib/python3/dist-packages/tuned_rl_plugins \
        /usr/lib/python3/dist-packages/tuned_rl-*.dist-info /usr/share/tuned-rl /usr/share/doc/tuned-rl /etc/tuned-rl \
        /etc/systemd/system/multi-user.target.wants/tuned-rl.service \
        /var/lib/systemd/deb-systemd-helper-enabled/tuned-rl.service.dsh-also; do
    [ -e "$path" ] && left+=" $path"
done
[ -z "$left" ] || fail "apt purge left:$left"
dpkg-query -W tuned-rl >/dev/null 2>&1 && fail "dpkg still knows tuned-rl after the purge"
"$checkout/.venv/bin/python" -c "import tuned_rl.core.agent" || fail "the checkout's virtual environment no longer imports tuned_rl"
say "purged: nothing the package installed or compiled is left; the checkout's .venv imports tuned_rl"
# What apt brought with it (python3-pluggy, ...) goes too: the next run meets a node as fresh as this one.
brought=$(comm -13 <(echo "$installed_before") <(installed_packages) | tr '\n' ' ')
if [ -n "${brought// }" ]; then
    # shellcheck disable=SC2086
    apt-get purge -y -qq $brought >/dev/null 2>&1 || fail "could not purge what the package's install brought: $brought"
    say "purged what the package's install brought: $brought"
fi
echo "the .deb builds, passes lintian, installs, runs and purges"
