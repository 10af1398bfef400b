#!/usr/bin/env bash
# Run the unit tests (not the kernel tests) under an older Python, 3.9 by default: the distro
# Python of RHEL 9, the oldest a fleet node runs. Uses pyenv's interpreter where there is one.
#     bash tools/test-older-python.sh [3.9|3.10]
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.9}
python=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/python"$version" 2>/dev/null | sort -V | tail -n 1 || true)
python=${python:-$(command -v "python$version" || true)}
if [ -z "$python" ]; then
    echo "no Python $version here (pyenv install $version): unit tests under $version not run" >&2
    exit 1
fi
venv=".venv-$version"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
"$venv/bin/python" -m pip install -q -e '.[test]'
"$venv/bin/python" -m pytest -q -p no:cacheprovider --ignore=tests/kernel
