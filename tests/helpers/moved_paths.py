"""Import old module paths in a fresh interpreter and report what each gave (shared by the unit and compat tests).

Fresh, because an old path imported once is cached in sys.modules and would not warn again; each import runs as
code compiled under the file name IMPORTER, so the warning's location shows it points at the importing line.
"""

from __future__ import annotations

import json
import subprocess
import sys

IMPORTER = "<old-import>"

_SCRIPT = r"""
import importlib, json, sys, warnings
import maxtext_compat
report = {}
for old, new in json.loads(sys.argv[1]).items():
    parent, _, child = old.rpartition(".")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(f"import {old}", "IMPORTER", "exec"), {})
    module, target = sys.modules[old], importlib.import_module(new)
    public = [n for n in dir(target) if not n.startswith("_")]
    namespace = {}
    if public:  # `from old import name`, through the module's own import statement
        exec(compile(f"from {old} import {public[0]}", "IMPORTER", "exec"), namespace)
    report[old] = {
        "same_module": module is target,
        "warnings": [
            [w.category.__name__, str(w.message), w.filename] for w in caught if "maxtext_compat" in str(w.message)
        ],
        "names": len(public),
        "names_identical": all(getattr(module, n) is getattr(target, n) for n in public),
        "from_import_identical": (not public) or namespace[public[0]] is getattr(target, public[0]),
        "parent_attribute_identical": getattr(sys.modules[parent], child) is module,
    }
print(json.dumps(report))
""".replace("IMPORTER", IMPORTER)


def import_old_paths(moved: dict[str, str]) -> dict[str, dict]:
    """{old path: what importing it gave, set beside the module at its new path} for {old: new} (full dotted
    paths), all in one fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(moved)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
