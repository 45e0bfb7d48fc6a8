"""Which compat_matrix.yaml row is installed: versions matched to rows, probes of the installed code, known defects.

`resolver.resolve` (also `maxtext_compat.resolve`) matches versions to a row, `probes` reads the installed code's
facts (signatures, return arity), `installed` and `installed_kernel` hand the resolved row and the kernel's call form
to the rest of the package, `defects` lists a row's known defects and when they apply.

Why not `resolve/`: `maxtext_compat.resolve` is the public function, and a subpackage of that name would replace it
on the package once imported.
"""
