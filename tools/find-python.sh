#!/usr/bin/env bash
# Print the path of a Python interpreter of exactly VERSION (default 3.12: the dev tools' and MaxText >= 0.2's;
# `environments:` in compat_matrix.yaml say which each environment wants, e.g. 3.11 for `unit`).
# usage: tools/find-python.sh [VERSION]
# Order: $MAXTEXT_COMPAT_PYTHON, pythonVERSION and python3 on PATH, pyenv's versions. A candidate is used only if
# it runs and reports that version (a pyenv shim for a version that is not active fails to run: skipped).
# The same search as maxtext_compat.runner.envs.find_python, which builds the environments.
set -u
want=${1:-3.12}
if ! [[ $want =~ ^3\.[0-9]+$ ]]; then
  echo "find-python: VERSION must look like 3.11 (major.minor), got '$want'" >&2
  exit 2
fi
check() { "$1" -c "import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$want' else 1)" >/dev/null 2>&1; }
cands=()
[ -n "${MAXTEXT_COMPAT_PYTHON:-}" ] && cands+=("$MAXTEXT_COMPAT_PYTHON")
for n in "python$want" python3; do p=$(command -v "$n" 2>/dev/null) && cands+=("$p"); done
root=${PYENV_ROOT:-$HOME/.pyenv}
for d in "$root"/versions/"$want".*; do [ -x "$d/bin/python$want" ] && cands+=("$d/bin/python$want"); done
for c in "${cands[@]}"; do if check "$c"; then echo "$c"; exit 0; fi; done
echo "find-python: no Python $want found (tried: ${cands[*]:-nothing}); install it or set MAXTEXT_COMPAT_PYTHON" >&2
exit 1
