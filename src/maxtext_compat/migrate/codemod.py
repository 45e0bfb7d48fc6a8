"""Find and rewrite old- or new-convention call sites of MaxText layers in one module (libcst).

What is a call site: a call of a name that resolves (imports and aliases followed by libcst) to a MaxText
Attention / MLA, decoder layer, Decoder or Transformer class or its Linen factory; of an instance of one
(`self.attn = Attention(...)` in any method, `attn = Attention(...)` in a function); of `Class(...)(...)`
inline; of `nnx_wrappers.ToLinen(Class, ...)` / `to_linen(Class, ...)`. A class handed to `nn.scan` is
listed as manual (its carry decides the return).

What is rewritten (`kv_return`): `x = attention(...)` -> `x, _ = attention(...)`, or, inside a function that
takes `kv_cache` and `attention_metadata`, `x, kv_cache = attention(..., kv_cache=kv_cache,
attention_metadata=attention_metadata)`; the same for decoder layers; `logits, hidden = decoder(...)` ->
`logits, hidden, _ = ...` (`kv_caches` threaded where the function takes it). `legacy` is the reverse,
only where the KV result is `_` (a KV cache used later cannot be dropped safely). Anything else that uses
the result (inside an expression, returned, passed on, starred) is reported as manual with the reason.
A second run changes nothing. The Transformer's return is the same in both conventions outside vLLM modes:
its sites are listed, never changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider

from maxtext_compat.migrate.callees import Callees, Kind

Target = Literal["kv_return", "legacy"]
KV_PARAMS = ("kv_cache", "attention_metadata")
_TIGHT = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
KV_ARG = {"attention": "kv_cache", "decoder_layer": "kv_cache", "decoder": "kv_caches"}
ARITY = {"attention": 1, "decoder_layer": 1, "decoder": 2}  # values before the KV result in the new return
SCAN_NAMES = ("flax.linen.scan", "flax.linen.transforms.scan", "flax.nnx.scan", "jax.lax.scan")
TO_LINEN = ("ToLinen", "to_linen")


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


class _Resolving:
    """Which MaxText class an expression names or builds (imports and aliases followed by libcst)."""

    callees: Callees
    bound: dict[str, Found]  # "attn" / "self.attn" -> (callee, kind): names bound to a MaxText layer

    def callee_of(self, call: cst.Call) -> Found | None:
        """What a call calls: a bound instance, or `Class(...)(...)` / `ToLinen(Class, ...)(...)` inline."""
        name = _dotted(call.func)
        if name is not None and name in self.bound:
            return self.bound[name]
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
        """`Class(...)`, `factory(...)`, `ToLinen(Class, ...)` or `nn.scan(Class, ...)`: the class and kind."""
        if not isinstance(value, cst.Call):
            return None
        found = self.resolve_class(value.func)
        if found is not None:
            return found
        scan = bool(self.qualified(value.func) & set(SCAN_NAMES))
        last = (_dotted(value.func) or "").rsplit(".", 1)[-1]
        if value.args and (last in TO_LINEN or scan):
            inner = self.resolve_class(value.args[0].value)
            if inner is not None:
                return (inner[0], "scanned") if scan else inner
        return None


class _Instances(_Resolving, cst.CSTVisitor):
    """First pass: names and self attributes bound to a MaxText layer (`x = Attention(...)`)."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self, callees: Callees) -> None:
        self.callees = callees
        self.bound = {}

    def visit_Assign(self, node: cst.Assign) -> None:
        found = self.resolve_built(node.value)
        if found is None or len(node.targets) != 1:
            return
        name = _dotted(node.targets[0].target)
        if name is not None:
            self.bound[name] = found


class _Counts(_Resolving, cst.CSTVisitor):
    """Second pass: how many call sites of each kind every function holds (threading one KV cache through
    two attention calls would hand the second the first's cache, so only a lone site is threaded)."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self, instances: _Instances) -> None:
        self.callees = instances.callees
        self.bound = instances.bound
        self.stack: list[cst.FunctionDef] = []
        self.counts: dict[int, dict[str, int]] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()

    def visit_Call(self, node: cst.Call) -> None:
        found = self.callee_of(node)
        if found is not None and self.stack:
            per = self.counts.setdefault(id(self.stack[-1]), {})
            per[found[1]] = per.get(found[1], 0) + 1


class _Returns(cst.CSTVisitor):
    """The return statements of one function body (not of functions or classes nested in it)."""

    def __init__(self) -> None:
        self.found: list[cst.Return] = []
        self.depth = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.depth += 1
        return self.depth == 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> None:
        self.found.append(node)


def _return_problem(node: cst.FunctionDef) -> str | None:
    """Why a decoder layer's returns cannot all get the KV cache appended (None when they can)."""
    collector = _Returns()
    node.visit(collector)
    for ret in collector.found:
        value = ret.value
        if value is None:
            return "a bare `return`"
        if isinstance(value, cst.Tuple):
            second = value.elements[-1].value if len(value.elements) == 2 else None
            if not (isinstance(second, cst.Name) and second.value == "None"):
                return "it returns a tuple other than the scanned (y, None)"
        elif isinstance(value, (cst.IfExp, cst.BooleanOperation)):
            return "a conditional return"
    return None


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
        self.classes: list[str] = []
        self.layer_calls: list[str | None] = []  # per function: the decoder layer whose __call__ it is changing

    # -- functions: which KV names they take ------------------------------------------------------
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
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
        attention_calls = self.counts.get(id(node), {}).get("attention", 0)
        if layer is not None and self.target == "kv_return" and "kv_cache" not in names:
            problem = _return_problem(node)
            if problem is not None:
                self._site(node, layer, "decoder_layer", "manual", f"{problem}: give the layer kv_cache by hand")
                layer = None
            elif attention_calls == 1:
                names |= {"kv_cache", "attention_metadata"}  # added below: the attention call threads them
            else:
                why = f"its __call__ makes {attention_calls} attention calls (a helper, or several): thread by hand"
                self._site(node, layer, "decoder_layer", "manual", why)
                layer = None
        elif layer is not None and (self.target != "legacy" or "kv_cache" not in names):
            layer = None  # already in the target convention
        self.params.append((id(node), names))
        self.layer_calls.append(layer)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self.params.pop()
        layer = self.layer_calls.pop()
        if layer is None:
            return updated
        if self.target == "kv_return":
            params = updated.params
            extra = [cst.Param(cst.Name(n), default=cst.Name("None"), equal=_TIGHT) for n in KV_PARAMS]
            if isinstance(params.star_arg, (cst.Param, cst.ParamStar)):  # after *args or *: keyword-only
                new_params = params.with_changes(kwonly_params=[*params.kwonly_params, *extra])
            else:
                appended = _append_items(list(params.params), extra, updated.whitespace_before_params)
                new_params = params.with_changes(params=appended)
            self._site(original, layer, "decoder_layer", "rewritten", "takes kv_cache=/attention_metadata= and "
                       "returns (y, kv_cache)")  # fmt: skip
            return updated.with_changes(params=new_params)
        params = updated.params
        kept = _without_items(list(params.params), lambda p: p.name.value in KV_PARAMS)
        kwonly = _without_items(list(params.kwonly_params), lambda p: p.name.value in KV_PARAMS)
        self._site(original, layer, "decoder_layer", "rewritten", "takes no KV arguments and returns y")
        return updated.with_changes(params=params.with_changes(params=kept, kwonly_params=kwonly))

    def leave_Return(self, original: cst.Return, updated: cst.Return) -> cst.Return:
        layer = self.layer_calls[-1] if self.layer_calls else None
        if layer is None or updated.value is None:
            return updated
        value = updated.value
        if self.target == "kv_return":
            if isinstance(value, cst.Tuple):
                return updated  # (y, None): a scanned layer's return (checked by _return_problem), the same in both
            pair = cst.Tuple([cst.Element(value, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                              cst.Element(cst.Name("kv_cache"))], lpar=[], rpar=[])  # fmt: skip
            return updated.with_changes(value=pair)
        if isinstance(value, cst.Tuple) and len(value.elements) == 2:
            second = value.elements[1].value
            if isinstance(second, cst.Name) and second.value == "kv_cache":
                return updated.with_changes(value=value.elements[0].value)
        return updated

    def _threads(self, kind: Kind) -> bool | None:
        """True: the enclosing function takes this kind's KV argument and the metadata and makes this one call
        of the kind (thread them); False: it does not take them (`_`); None: it takes them but makes several
        such calls (which cache goes where is for a human)."""
        if not self.params:
            return False
        func, names = self.params[-1]
        if not {KV_ARG[kind], "attention_metadata"} <= names:
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
        new_arity = ARITY[kind] + 1
        if self.target == "kv_return":
            if len(names) == new_arity:
                self._site(original, callee, kind, "unchanged", "already unpacks the new return")
                return updated
            if len(names) != ARITY[kind]:
                self._site(original, callee, kind, "manual", f"unpacks {len(names)} values; the old return has "
                           f"{ARITY[kind]}")  # fmt: skip
                return updated
            threads = self._threads(kind)
            if threads is None:
                self._site(original, callee, kind, "manual", f"the function takes {KV_ARG[kind]}= and makes several "
                           f"{kind} calls: thread each call's cache by hand")  # fmt: skip
                return updated
            kv_name = KV_ARG[kind] if threads else "_"
            value = self._with_kv_args(updated.value, kind) if threads else updated.value
            elements = [*(cst.Element(n) for n in names), cst.Element(cst.Name(kv_name))]
            new_target = cst.Tuple(elements, lpar=[], rpar=[])
            passes = f"; passes {KV_ARG[kind]}= and attention_metadata=" if threads else ""
            change = f"unpacks (…, {kv_name}){passes}"
            self._site(original, callee, kind, "rewritten", change)
            return updated.with_changes(targets=[cst.AssignTarget(new_target)], value=value)
        # legacy
        if len(names) == ARITY[kind]:
            self._site(original, callee, kind, "unchanged", "already takes the old return")
            return updated
        if len(names) != new_arity:
            self._site(original, callee, kind, "manual", f"unpacks {len(names)} values")
            return updated
        last = names[-1]
        stripping = bool(self.layer_calls and self.layer_calls[-1]) and KV_ARG[kind] == "kv_cache"
        if not (isinstance(last, cst.Name) and (last.value == "_" or (stripping and last.value == "kv_cache"))):
            self._site(original, callee, kind, "manual", "the KV result is used (legacy code has no KV cache)")
            return updated
        keep = names[:-1]
        new_target = keep[0] if len(keep) == 1 else cst.Tuple([cst.Element(n) for n in keep], lpar=[], rpar=[])
        value = self._without_kv_args(updated.value, kind)
        self._site(original, callee, kind, "rewritten", "takes the old return")
        return updated.with_changes(targets=[cst.AssignTarget(new_target)], value=value)

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

    def _with_kv_args(self, call: cst.BaseExpression, kind: Kind) -> cst.BaseExpression:
        assert isinstance(call, cst.Call)
        named = {a.keyword.value for a in call.args if a.keyword is not None}
        extra = [
            cst.Arg(cst.Name(name), keyword=cst.Name(name), equal=_TIGHT)
            for name in (KV_ARG[kind], "attention_metadata")
            if name not in named
        ]
        if not extra:
            return call
        return call.with_changes(args=_append_items(list(call.args), extra, call.whitespace_before_args))

    def _without_kv_args(self, call: cst.BaseExpression, kind: Kind) -> cst.BaseExpression:
        assert isinstance(call, cst.Call)
        names = {KV_ARG[kind], "attention_metadata"}
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
    rewriter = _Rewriter(instances, counts, target, module)
    new = wrapper.visit(rewriter)
    sites = sorted(rewriter.sites, key=lambda s: (s.line, s.column))
    return Result(new.code, sites)
