"""Find and rewrite old- or new-convention call sites of MaxText layers in one module (libcst).

What is a call site: a call of a name that resolves (imports and aliases followed by libcst) to a MaxText
Attention / MLA, decoder layer, Decoder or Transformer class or its Linen factory; of an instance of one
(`self.attn = Attention(...)` in a method of the same class, `attn = Attention(...)` in the same function or
an enclosing one); of `Class(...)(...)` inline; of `nnx_wrappers.ToLinen(Class, ...)` / `to_linen(Class, ...)`
and `ToNNX(instance, ...)`. A class handed to `nn.scan` is listed as manual (its carry decides the return).

What is rewritten (`kv_return`): `x = attention(...)` -> `x, kv_cache = attention(..., kv_cache=kv_cache,
attention_metadata=attention_metadata)` inside a function that takes both, else `x, _ = attention(...,
kv_cache=None, attention_metadata=None)`; the same for decoder layers; `logits, hidden = decoder(...)` ->
`logits, hidden, _ = decoder(..., kv_caches=None, attention_metadata=None)` (`kv_caches` threaded where the
function takes it). Why a moved call always names its KV arguments: a call that names them is a new call in
every convention (MaxText 0.2.x, or an older release under the vllm-backport shim), so `x, _ = ...` can
never unpack a bare output's batch axis; where the callee cannot take them the call fails loudly.
`legacy` is the reverse, only where the KV result is `_` and the KV arguments are absent or None (a cache
used or written cannot be dropped safely). Anything else that uses the result (inside an expression,
returned, passed on, starred) is reported as manual with the reason. A second run changes nothing.

A decoder layer the matrix lists that is *defined* in the migrated code (MaxText's own source, a fork) is
listed as manual, never rewritten: MaxText's Decoder calls its layers through classes chosen at run time
(`get_decoder_layers()`), a call no codemod can follow, so changing a layer's return alone would break that
loop. The Transformer's return is the same in both conventions outside vLLM modes: its sites are listed,
never changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider

from maxtext_compat.convention.kinds import KINDS, METADATA
from maxtext_compat.matrix.returns import caller_shape
from maxtext_compat.migrate.callees import Callees, Kind

Target = Literal["kv_return", "legacy"]
_TIGHT = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
DEFINED_LAYER = (
    "a decoder layer defined here: MaxText's Decoder calls its layers through classes chosen at run time "
    "(get_decoder_layers()), which migrate cannot follow; move this layer's signature and returns together "
    "with the Decoder's layer loop by hand"
)
SCAN_NAMES = ("flax.linen.scan", "flax.linen.transforms.scan", "flax.nnx.scan", "jax.lax.scan")
BRIDGES = ("ToLinen", "to_linen", "ToNNX", "to_nnx")  # Linen <-> NNX wrappers: the same layer, the same return


@dataclass(frozen=True)
class Site:
    """One call site: where, what it calls, and what migrate does with it."""

    line: int
    column: int
    callee: str
    kind: Kind | Literal["scanned"]
    change: str  # "rewritten", "unchanged" (already in the target convention or nothing to do), "manual"
    detail: str  # the change made, or why it is left to a human

    def as_dict(self) -> dict[str, object]:
        return {"line": self.line, "column": self.column, "callee": self.callee, "kind": self.kind,
                "change": self.change, "detail": self.detail}  # fmt: skip


@dataclass
class Result:
    code: str
    sites: list[Site] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(s.change == "rewritten" for s in self.sites)


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr.value}"
    return None


Found = tuple[str, Kind | Literal["scanned"]]  # (the class's dotted name, the kind of call site)


Scope = tuple[object, str]  # (the class's dotted name for `self.x`, else the function's id or None for the module)


class _Resolving:
    """Which MaxText class an expression names or builds (imports and aliases followed by libcst).

    Bindings are scoped: `self.attn` to the class whose method binds it (another class's `self.attn` is another
    object), a plain name to the function that binds it and the functions nested in it (or to the module).
    """

    callees: Callees
    bound: dict[Scope, Found]  # (scope, "attn" / "self.attn") -> (callee, kind): names bound to a MaxText layer
    classes: list[str]
    functions: list[int]

    def enter(self, node: cst.FunctionDef | cst.ClassDef) -> None:
        if isinstance(node, cst.ClassDef):
            self.classes.append(node.name.value)
        else:
            self.functions.append(id(node))

    def leave(self, node: cst.FunctionDef | cst.ClassDef) -> None:
        (self.classes if isinstance(node, cst.ClassDef) else self.functions).pop()

    def bind(self, name: str, found: Found) -> None:
        if name.startswith("self."):
            if self.classes:
                self.bound[(".".join(self.classes), name)] = found
            return
        self.bound[(self.functions[-1] if self.functions else None, name)] = found

    def lookup(self, name: str) -> Found | None:
        if name.startswith("self."):
            return self.bound.get((".".join(self.classes), name)) if self.classes else None
        for scope in [*reversed(self.functions), None]:
            if (scope, name) in self.bound:
                return self.bound[(scope, name)]
        return None

    def callee_of(self, call: cst.Call) -> Found | None:
        """What a call calls: a bound instance, or `Class(...)(...)` / `ToLinen(Class, ...)(...)` inline."""
        name = _dotted(call.func)
        found = self.lookup(name) if name is not None else None
        if found is not None:
            return found
        if isinstance(call.func, cst.Call):
            return self.resolve_built(call.func)
        return None

    def qualified(self, node: cst.CSTNode) -> set[str]:
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}  # type: ignore[attr-defined]

    def resolve_class(self, node: cst.BaseExpression) -> Found | None:
        for name in sorted(self.qualified(node)):
            kind = self.callees.kind_of(name)
            if kind is not None:
                return name, kind
        return None

    def resolve_built(self, value: cst.BaseExpression) -> Found | None:
        """`Class(...)`, `factory(...)`, `ToLinen(Class, ...)`, `ToNNX(instance, ...)` or `nn.scan(Class, ...)`:
        the class and kind."""
        if not isinstance(value, cst.Call):
            return None
        found = self.resolve_class(value.func)
        if found is not None:
            return found
        scan = bool(self.qualified(value.func) & set(SCAN_NAMES))
        last = (_dotted(value.func) or "").rsplit(".", 1)[-1]
        if value.args and (last in BRIDGES or scan):
            first = value.args[0].value
            name = _dotted(first)
            inner = self.resolve_class(first) or (self.lookup(name) if name is not None and not scan else None)
            if inner is not None:
                return (inner[0], "scanned") if scan else inner
        return None


class _ScopedVisitor(_Resolving, cst.CSTVisitor):
    """A read-only pass that keeps the class and function stacks the bindings are scoped by."""

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.enter(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.leave(original_node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.enter(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.leave(original_node)


class _Instances(_ScopedVisitor):
    """First pass: names and self attributes bound to a MaxText layer (`x = Attention(...)`)."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self, callees: Callees) -> None:
        self.callees = callees
        self.bound = {}
        self.classes, self.functions = [], []

    def visit_Assign(self, node: cst.Assign) -> None:
        found = self.resolve_built(node.value)
        if found is None or len(node.targets) != 1:
            return
        name = _dotted(node.targets[0].target)
        if name is not None:
            self.bind(name, found)


class _Counts(_ScopedVisitor):
    """Second pass: how many call sites of each kind every function holds (threading one KV cache through
    two attention calls would hand the second the first's cache, so only a lone site is threaded)."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self, instances: _Instances) -> None:
        self.callees = instances.callees
        self.bound = instances.bound
        self.classes, self.functions = [], []
        self.counts: dict[int, dict[str, int]] = {}
        self.calls = 0  # every call site, in a function or not

    def visit_Call(self, node: cst.Call) -> None:
        found = self.callee_of(node)
        if found is None:
            return
        self.calls += 1
        if self.functions:
            per = self.counts.setdefault(self.functions[-1], {})
            per[found[1]] = per.get(found[1], 0) + 1


def _without_items(items: list, drop: Callable[[Any], bool]) -> list:
    """`items` minus the dropped ones, the last kept one taking the comma (and line layout) of the old last."""
    kept = [i for i in items if not drop(i)]
    if kept and len(kept) != len(items) and drop(items[-1]):
        kept[-1] = kept[-1].with_changes(comma=items[-1].comma)
    return kept


def _append_items(items: list, extra: list, opening: cst.BaseParenthesizableWhitespace) -> list:
    """`items + extra` in the layout of `items` (call arguments or parameters: each carries its comma).

    One per line (the trailing comma kept) when they are, else `, `-separated. `opening` is the whitespace
    after the opening parenthesis: it gives the indentation when there is a single item on its own line.
    """
    inline = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if not items:
        return [*(e.with_changes(comma=inline) for e in extra[:-1]), extra[-1]]
    last = items[-1]
    closing = last.comma
    if not (isinstance(closing, cst.Comma) and isinstance(closing.whitespace_after, cst.ParenthesizedWhitespace)):
        head = [*items[:-1], last.with_changes(comma=inline)]
        return [*head, *(e.with_changes(comma=inline) for e in extra[:-1]), extra[-1].with_changes(comma=closing)]
    if len(items) > 1 and isinstance(items[-2].comma, cst.Comma):
        between = items[-2].comma
    else:
        between = cst.Comma(whitespace_after=opening)
    return [*items[:-1], last.with_changes(comma=between), *(e.with_changes(comma=between) for e in extra[:-1]),
            extra[-1].with_changes(comma=closing)]  # fmt: skip


class _Rewriter(_Resolving, cst.CSTTransformer):
    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider, ParentNodeProvider)

    def __init__(self, instances: _Instances, counts: _Counts, target: Target, module: str | None) -> None:
        self.callees = instances.callees
        self.bound = instances.bound
        self.counts = counts.counts
        self.target = target
        self.dotted_module = module  # the dotted name of the file being migrated, when it lies in a package
        self.sites: list[Site] = []
        self.params: list[tuple[int, set[str]]] = []  # (function id, parameter names) of the enclosing functions
        self.classes, self.functions = [], []

    # -- functions: which KV names they take ------------------------------------------------------
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.enter(node)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.leave(original)
        return updated

    def _layer_class(self, node: cst.FunctionDef) -> str | None:
        """`module.Class` when `node` is the __call__ of a decoder layer the matrix lists, defined in this file."""
        if node.name.value != "__call__" or not self.classes or self.dotted_module is None:
            return None
        dotted = f"{self.dotted_module}.{'.'.join(self.classes)}"
        return dotted if self.callees.kind_of(dotted) == "decoder_layer" else None

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        p = node.params
        names = {x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)}
        layer = self._layer_class(node)
        takes_kv = "kv_cache" in names
        if layer is not None and takes_kv != (self.target == "kv_return"):
            self._site(node, layer, "decoder_layer", "manual", DEFINED_LAYER)
        self.params.append((id(node), names))
        self.enter(node)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.params.pop()
        self.leave(original)
        return updated

    def _threads(self, kind: Kind) -> bool | None:
        """True: the enclosing function takes this kind's KV argument and the metadata and makes this one call
        of the kind (thread them); False: it does not take them (`_`); None: it takes them but makes several
        such calls (which cache goes where is for a human)."""
        if not self.params:
            return False
        func, names = self.params[-1]
        if not {KINDS[kind].kv_name, METADATA} <= names:
            return False
        return True if self.counts.get(func, {}).get(kind, 0) == 1 else None

    # -- sites ------------------------------------------------------------------------------------
    def _site(self, node: cst.CSTNode, callee: str, kind: Kind | Literal["scanned"], change: str, detail: str) -> None:
        pos = self.get_metadata(PositionProvider, node)
        self.sites.append(Site(pos.start.line, pos.start.column + 1, callee, kind, change, detail))

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.BaseSmallStatement:
        if not isinstance(original.value, cst.Call):
            return updated
        found = self.callee_of(original.value)
        if found is None:
            return updated
        callee, kind = found
        if kind == "scanned":
            self._site(original, callee, kind, "manual", "a layer under nn.scan: the scan's carry decides the return")
            return updated
        if kind == "transformer":
            self._site(original, callee, kind, "unchanged", "the Transformer returns the same outside vLLM modes")
            return updated
        if len(original.targets) != 1:
            self._site(original, callee, kind, "manual", "the result is assigned to several targets")
            return updated
        target = original.targets[0].target
        names = self._target_names(target)
        if names is None:
            self._site(original, callee, kind, "manual", "the result is unpacked into a starred or nested target")
            return updated
        # The two returns, from the rows (compat_matrix.yaml `returns:`): the KV result's place in the new one
        new = self.callees.new_return(callee)
        old_arity = caller_shape(kind, new=False).arity
        if new is None or new.kv_index is None or new.arity != old_arity + 1:
            self._site(original, callee, kind, "manual", f"the releases' returns of {callee} differ or add more than "
                       f"the KV result ({self.callees.returns_by_release(callee)}): unpack by hand")  # fmt: skip
            return updated
        at, new_arity = new.kv_index, new.arity
        if self.target == "kv_return":
            if len(names) == new_arity:
                self._site(original, callee, kind, "unchanged", "already unpacks the new return")
                return updated
            if len(names) != old_arity:
                self._site(original, callee, kind, "manual", f"unpacks {len(names)} values; the old return has "
                           f"{old_arity}")  # fmt: skip
                return updated
            threads = self._threads(kind)
            if threads is None:
                self._site(original, callee, kind, "manual", f"the function takes {KINDS[kind].kv_name}= and makes "
                           f"several {kind} calls: thread each call's cache by hand")  # fmt: skip
                return updated
            kv_name = KINDS[kind].kv_name if threads else "_"
            value = self._with_kv_args(updated.value, kind, threads)
            elements = [cst.Element(n) for n in names]
            elements.insert(at, cst.Element(cst.Name(kv_name)))
            new_target = cst.Tuple(elements, lpar=[], rpar=[])
            given = "" if threads else "None"
            unpacks = ", ".join(kv_name if i == at else "…" for i in range(new_arity) if i in (at, at - 1, at + 1))
            change = f"unpacks ({unpacks}); passes {KINDS[kind].kv_name}={given} and attention_metadata={given}"
            self._site(original, callee, kind, "rewritten", change)
            return updated.with_changes(targets=[cst.AssignTarget(new_target)], value=value)
        # legacy
        if len(names) == old_arity:
            self._site(original, callee, kind, "unchanged", "already takes the old return")
            return updated
        if len(names) != new_arity:
            self._site(original, callee, kind, "manual", f"unpacks {len(names)} values")
            return updated
        kv = names[at]
        if not (isinstance(kv, cst.Name) and kv.value == "_"):
            self._site(original, callee, kind, "manual", "the KV result is used (legacy code has no KV cache)")
            return updated
        passed = self._kv_values(original.value, kind)
        if passed:
            self._site(original, callee, kind, "manual", f"passes {', '.join(passed)} (a legacy call cannot write a "
                       "KV cache)")  # fmt: skip
            return updated
        keep = names[:at] + names[at + 1 :]
        kept = (
            cast(cst.BaseAssignTargetExpression, keep[0])
            if len(keep) == 1
            else cst.Tuple([cst.Element(n) for n in keep], lpar=[], rpar=[])
        )
        value = self._without_kv_args(updated.value, kind)
        self._site(original, callee, kind, "rewritten", "takes the old return")
        return updated.with_changes(targets=[cst.AssignTarget(kept)], value=value)

    def _target_names(self, target: cst.BaseAssignTargetExpression) -> list[cst.BaseExpression] | None:
        if isinstance(target, (cst.Name, cst.Attribute, cst.Subscript)):
            return [target]
        if isinstance(target, (cst.Tuple, cst.List)):
            out = []
            for el in target.elements:
                if isinstance(el, cst.StarredElement) or isinstance(el.value, (cst.Tuple, cst.List)):
                    return None
                out.append(el.value)
            return out
        return None

    def _with_kv_args(self, call: cst.BaseExpression, kind: Kind, threads: bool) -> cst.BaseExpression:
        """`call` naming its KV arguments: the enclosing function's own (threads) or None."""
        assert isinstance(call, cst.Call)
        named = {a.keyword.value for a in call.args if a.keyword is not None}
        extra = [
            cst.Arg(cst.Name(name if threads else "None"), keyword=cst.Name(name), equal=_TIGHT)
            for name in (KINDS[kind].kv_name, METADATA)
            if name not in named
        ]
        if not extra:
            return call
        return call.with_changes(args=_append_items(list(call.args), extra, call.whitespace_before_args))

    def _kv_values(self, call: cst.BaseExpression, kind: Kind) -> list[str]:
        """The KV arguments `call` passes a value other than None (`name=value`, as written)."""
        assert isinstance(call, cst.Call)
        names = {KINDS[kind].kv_name, METADATA}
        return [
            f"{a.keyword.value}={cst.Module([]).code_for_node(a.value)}"
            for a in call.args
            if a.keyword is not None
            and a.keyword.value in names
            and not (isinstance(a.value, cst.Name) and a.value.value == "None")
        ]

    def _without_kv_args(self, call: cst.BaseExpression, kind: Kind) -> cst.BaseExpression:
        assert isinstance(call, cst.Call)
        names = {KINDS[kind].kv_name, METADATA}
        args = _without_items(list(call.args), lambda a: a.keyword is not None and a.keyword.value in names)
        return call.with_changes(args=args)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        found = self.callee_of(original)
        parent = self.get_metadata(ParentNodeProvider, original)
        if found is None or (isinstance(parent, cst.Assign) and parent.value is original):
            return updated  # a statement's whole value: leave_Assign decides
        callee, kind = found
        if kind == "transformer":
            self._site(original, callee, kind, "unchanged", "the Transformer returns the same outside vLLM modes")
        elif isinstance(parent, cst.Expr):
            self._site(original, callee, kind, "unchanged", "the result is not used")
        else:
            self._site(original, callee, kind, "manual", _why_manual(parent))
        return updated


def _why_manual(parent: cst.CSTNode) -> str:
    if isinstance(parent, cst.Return):
        return "the result is returned directly: the caller's unpacking decides"
    if isinstance(parent, cst.Arg):
        return "the result is passed on as an argument"
    if isinstance(parent, (cst.StarredElement, cst.StarredDictElement)):
        return "the result is starred"
    if isinstance(parent, (cst.AugAssign, cst.AnnAssign)):
        return "the result is used in an augmented or annotated assignment"
    return "the result is used inside an expression"


def migrate_source(code: str, callees: Callees, target: Target, module: str | None = None) -> Result:
    """Rewrite `code` (one module) to `target`; raises libcst.ParserSyntaxError on unparsable code.

    module: the file's dotted name (`MaxText.layers.llama2`), so a decoder layer the matrix lists that is
    *defined* here gets the new signature and returns too (migrating MaxText's own source or a fork).
    """
    wrapper = MetadataWrapper(cst.parse_module(code))
    instances = _Instances(callees)
    wrapper.visit(instances)
    counts = _Counts(instances)
    wrapper.visit(counts)
    if not counts.calls and not callees.defined_in(module):
        return Result(code)  # nothing to rewrite or list: the rewriting pass (the slowest) is not needed
    rewriter = _Rewriter(instances, counts, target, module)
    new = wrapper.visit(rewriter)
    sites = sorted(rewriter.sites, key=lambda s: (s.line, s.column))
    return Result(new.code, sites)
