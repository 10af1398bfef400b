#!/usr/bin/env bash
# Build dist/tuned-rl_VERSION_all.deb with Debian's own tools (dpkg-buildpackage: debhelper, dh-python's
# pybuild) from the debian/ folder: tuned-rl for Debian's Python 3, depending on Debian's packages
# (python3-bpfcc, python3-pluggy, ...), so a node needs no virtual environment:
#     bash packaging/debian/build.sh && apt-get install ./dist/tuned-rl_*_all.deb
# The build runs in a copy of the checkout's files (tracked and new, not ignored ones), so that nothing
# lands beside or inside the checkout but dist/: the source package (.dsc, .tar.xz), the .changes, the
# .buildinfo and the .deb. Needs the build dependencies of debian/control (apt-get build-dep, or
# packaging/debian/test-install.sh installs them). The last line printed is the .deb's path.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$(dpkg-parsechangelog -S Version)
pyproject_version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
if [ "$version" != "$pyproject_version" ]; then
    echo "debian/changelog says $version, pyproject.toml $pyproject_version: add a changelog entry (dch -v)" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/tuned-rl-$version"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' file; do
    [ -e "$file" ] && printf '%s\0' "$file"   # a file deleted but not yet committed is left out
done | tar --null -T - -cf - | tar -xf - -C "$work/tuned-rl-$version"
# Debian's Python and tools only: a pyenv or virtual environment earlier on PATH is not what the package runs on.
(cd "$work/tuned-rl-$version" && env PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage --no-sign -us -uc \
    >"$work/build.log" 2>&1) || {
    tail -n 40 "$work/build.log" >&2
    exit 1
}
mkdir -p dist
for file in "$work"/tuned-rl_"$version"*; do
    cp "$file" dist/
done
echo "dist/tuned-rl_${version}_all.deb"
