#!/usr/bin/env bash
# Print the path of a Python >= 3.12 interpreter (MaxText and jax >= 0.11 need it).
# Order: $MAXTEXT_COMPAT_PYTHON, python3.12/3.13 on PATH, pyenv's versions, python3.
set -u
check() { "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 12) else 1)' >/dev/null 2>&1; }
cands=()
[ -n "${MAXTEXT_COMPAT_PYTHON:-}" ] && cands+=("$MAXTEXT_COMPAT_PYTHON")
for n in python3.12 python3; do p=$(command -v "$n" 2>/dev/null) && cands+=("$p"); done
root=${PYENV_ROOT:-$HOME/.pyenv}
for d in "$root"/versions/3.12*; do [ -x "$d/bin/python3.12" ] && cands+=("$d/bin/python3.12"); done
for c in "${cands[@]}"; do if check "$c"; then echo "$c"; exit 0; fi; done
echo "find-python: no Python 3.12 found (tried: ${cands[*]:-nothing}); install it or set MAXTEXT_COMPAT_PYTHON" >&2
exit 1
