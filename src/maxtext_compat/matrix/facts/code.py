"""Reading MaxText's classes from their source with `ast`: where a class is, its `__call__` signature, its returns.

Why ast: the facts of a release (what a call takes and gives back) are in its `def` headers and `return`
statements; reading them needs no import of MaxText, so any release (a wheel, a fork) can be read anywhere.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from maxtext_compat.matrix.facts.sources import ReleaseFiles


@dataclass(frozen=True)
class Param:
    """One parameter of a `def`, after `self`."""

    name: str
    keyword_only: bool
    has_default: bool

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "keyword_only": self.keyword_only, "has_default": self.has_default}


@dataclass(frozen=True)
class Method:
    """A method as the facts need it: its parameters and the expressions it returns (nested defs left out)."""

    params: tuple[Param, ...]
    returns: tuple[ast.expr, ...]
    node: ast.FunctionDef

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


def module_file(files: ReleaseFiles, module: str) -> str | None:
    """The file of a dotted module in the release (`a/b.py` or `a/b/__init__.py`), None when it has none."""
    base = module.replace(".", "/")
    for name in (f"{base}.py", f"{base}/__init__.py"):
        if name in files.names:
            return name
    return None


def parse(files: ReleaseFiles, name: str) -> ast.Module | None:
    text = files.text(name)
    return None if text is None else _parse(text)


@lru_cache(maxsize=64)
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


def find_class(files: ReleaseFiles, module: str, name: str) -> ast.ClassDef | None:
    """The top-level class `name` of `module`, None when the module or the class is not there."""
    path = module_file(files, module)
    tree = parse(files, path) if path else None
    if tree is None:
        return None
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def first_class(files: ReleaseFiles, modules: tuple[str, ...], name: str) -> str | None:
    """`module:Name` for the first of `modules` that defines class `name`."""
    for module in modules:
        if find_class(files, module, name) is not None:
            return f"{module}:{name}"
    return None


def method(files: ReleaseFiles, ref: str | None, name: str = "__call__") -> Method | None:
    """The method `name` defined in the class `ref` (`module:Class`) itself, None when it is not."""
    if ref is None:
        return None
    module, _, cls_name = ref.partition(":")
    cls = find_class(files, module, cls_name)
    if cls is None:
        return None
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        return None
    returns = [r for r in own_nodes(fn, ast.Return) if isinstance(r, ast.Return)]
    return Method(_params(fn), tuple(r.value for r in returns if r.value is not None), fn)


def _params(fn: ast.FunctionDef) -> tuple[Param, ...]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    first_default = len(positional) - len(a.defaults)
    out = [Param(p.arg, False, i >= first_default) for i, p in enumerate(positional)]
    out += [Param(p.arg, True, d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    return tuple(out[1:] if out and out[0].name in ("self", "cls") else out)


def own_nodes(fn: ast.AST, kind: type[ast.AST]) -> Iterator[ast.AST]:
    """Nodes of `kind` in a function's own body: the bodies of nested functions, lambdas and classes are theirs."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop(0)
        if isinstance(node, kind):
            yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def tuples(m: Method | None) -> list[tuple[ast.expr, ...]]:
    """Each returned tuple's elements (a bare value counts as a 1-tuple)."""
    if m is None:
        return []
    return [tuple(r.elts) if isinstance(r, ast.Tuple) else (r,) for r in m.returns]


def name_of(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else ""


def strings(files: ReleaseFiles, path: str | None) -> list[str]:
    """Every string constant of a file, in the order they are written."""
    tree = parse(files, path) if path else None
    if tree is None:
        return []
    found = [(n.lineno, n.col_offset, n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)]  # fmt: skip
    return [value for _, _, value in sorted(found)]
