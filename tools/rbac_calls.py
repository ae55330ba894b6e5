"""The Kubernetes API requests the controller makes, derived from its code, and the grants of config/rbac they need.

mypy, the project's type checker, reads ipam_provider/ and backends/ with their types. Every call of a KubeClient
request method (and every call that hands a `Resource` to a method of that name) is a request. Its Resource is
followed back, as mypy resolves names, to `Resource(...)` calls with constant arguments: through module constants,
instance and dataclass attributes, the parameters of a function (per call of it, `functools.partial` included),
return values, containers, subscripts and loops. A PoolKind that cannot be followed is any PoolKind the code
constructs (they are the backends' constants). Namespaces and names are followed the same way; one that cannot be
followed is any namespace or name (`ANY`).

A request whose Resource cannot be followed is `unresolved`, with its line, and so is a request the derivation
cannot see (a request method passed on as a value, the Kubernetes client library used beside KubeClient): a new
request is never silently left out. What the code does not say by itself is in small tables, each entry with its
reason: BY_HAND (values from flags), TABLES (a Resource built from a lookup table), BLOCKING_OWNERS (the owners
whose `finalizers` a blockOwnerDeletion reference needs) and NOT_THE_CONTROLLER (code run by another identity).

`missing` and `unused` compare the requests with the rules of config/rbac's Roles, both ways.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mypy import build, nodes, types
from mypy.config_parser import parse_config_file
from mypy.find_sources import create_source_list
from mypy.modulefinder import BuildSource
from mypy.options import Options

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ipam_provider", "backends")
ANY = "*"
OWN_NAMESPACE = "<own namespace>"  # the namespace the controller runs in (its leader-election Lease lives there)

KUBE_CLIENT = "ipam_provider.runtime.kube.client.KubeClient"
RESOURCE = "ipam_provider.runtime.kube.resources.Resource"
POOL_KIND = "ipam_provider.backend.contract.PoolKind"
# The frozen dataclasses whose constructions are followed, with the fields that matter to RBAC.
RECORDS = {RESOURCE: ("group", "plural", "namespaced"), POOL_KIND: ("group", "plural", "namespaced")}
VERBS = {
    "get": "get",
    "list": "list",
    "list_pages": "list",
    "watch": "watch",
    "create": "create",
    "create_subresource": "create",
    "replace": "update",
    "patch": "patch",
    "delete": "delete",
}
CLIENT_MODULES = ("ipam_provider.runtime.kube.client", "ipam_provider.runtime.kube")  # may use kubernetes_asyncio
NOT_REQUESTS = frozenset({"close", "host", "from_kubeconfig"})  # KubeClient members that send no request
# Code that does not run as the controller: its requests need no grant of config/rbac.
NOT_THE_CONTROLLER = {
    "ipam_provider.statusview": "`ipam-provider status`, run by an operator with their own kubeconfig",
}
# Functions that write ownerReferences with blockOwnerDeletion: true. With the OwnerReferencesPermissionEnforcement
# admission plugin, that needs `update` on each owner's `finalizers` subresource. Their owners, by hand:
BLOCKING_OWNERS = {
    # An IPAddress's owners: its claim (the controller reference) and the claim's pool, of any kind ("pools").
    "ipam_provider.reconcile.addresses.owner_references": ("ipam_provider.api.capi.CLAIMS", "pools"),
    # A control-plane endpoint's claim: its Cluster.
    "ipam_provider.endpoint.endpoint_claim": ("ipam_provider.api.capi.CLUSTERS",),
}


@dataclass(frozen=True)
class Record:
    """The constant value of a Resource or PoolKind."""

    cls: str
    fields: tuple[tuple[str, object], ...]

    def __getitem__(self, name: str) -> object:
        return dict(self.fields)[name]


@dataclass(frozen=True)
class Items:
    """A container: the values its elements may have."""

    values: frozenset[object]


# Requests whose Resource is built from a table the derivation cannot follow by itself, by the function making
# them: the table, a constant mapping (group, kind) to the plural, from which each Resource (namespaced) is taken.
TABLES = {
    # The Infoblox owner walk reads an owner only if OWNER_KINDS names its (group, kind), in the claim's namespace.
    "backends.infoblox.hostname._OwnerWalk.read": "backends.infoblox.hostname.OWNER_KINDS",
}
# Values the code takes from outside it (flags), by the variable's full name, with why.
BY_HAND: dict[str, object] = {
    # --leader-election-namespace: config/manager sets it to the pod's namespace ($(POD_NAMESPACE)).
    "ipam_provider.flags.LeaderElection.namespace": OWN_NAMESPACE,
}


@dataclass(frozen=True, order=True)
class Request:
    """One kind of request: `namespace` is ANY (any namespace, or a cluster-scoped resource), OWN_NAMESPACE or a
    named one; `name` is ANY or the one object's name; `resource` is `plural` or `plural/subresource`."""

    verb: str
    group: str
    resource: str
    namespace: str = ANY
    name: str = ANY


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource of one rule of config/rbac: `role` is ClusterRole or Role (in OWN_NAMESPACE)."""

    role: str
    verb: str
    group: str
    resource: str
    name: str = ANY

    def covers(self, request: Request) -> bool:
        if (self.verb, self.group, self.resource) != (request.verb, request.group, request.resource):
            return False
        if self.name != ANY and self.name != request.name:
            return False
        return self.role == "ClusterRole" or request.namespace == OWN_NAMESPACE


@dataclass
class Derivation:
    """The requests (each with where it is made) and the calls whose request could not be derived."""

    requests: dict[Request, list[str]] = field(default_factory=dict)
    unresolved: list[str] = field(default_factory=list)


class Unresolved(Exception):
    """A value the derivation cannot follow; the message says where."""


@dataclass(frozen=True)
class Site:
    """Where an expression is: its module and the function (None: the module's top level) around it; `caller`, if
    given, is the one call of that function whose arguments its parameters take."""

    module: str
    func: nodes.FuncItem | None
    caller: Caller | None = None


@dataclass(frozen=True)
class Caller:
    """A call of a function: its arguments (a partial's first), as mypy lists them, and where it is."""

    args: tuple[nodes.Expression, ...]
    kinds: tuple[nodes.ArgKind, ...]
    names: tuple[str | None, ...]
    site: Site


_SKIPPED = frozenset({"node", "def_var", "info", "analyzed", "original_def", "type", "unanalyzed_type", "expanded"})


def _attributes(cls: type) -> Iterable[str]:
    compiled = getattr(cls, "__mypyc_attrs__", None)
    if compiled is not None:
        return tuple(compiled)
    return [name for klass in cls.__mro__ for name in getattr(klass, "__slots__", ())]


_CHILD_ATTRIBUTES: dict[type, tuple[str, ...]] = {}


def _child_attributes(cls: type) -> tuple[str, ...]:
    """The attributes of a node class that may hold the nodes inside it (references to definitions left out),
    worked out once per class."""
    found = _CHILD_ATTRIBUTES.get(cls)
    if found is None:
        found = tuple(name for name in _attributes(cls) if name not in _SKIPPED and not name.startswith("_"))
        _CHILD_ATTRIBUTES[cls] = found
    return found


_CHILD_TYPES = (nodes.Statement, nodes.Expression, nodes.Block, nodes.Argument)


def _children(node: nodes.Node) -> Iterator[nodes.Node]:
    """The statements, expressions, blocks and arguments inside `node` (references to definitions not followed)."""
    for attribute in _child_attributes(type(node)):
        value = getattr(node, attribute, None)
        if isinstance(value, (list, tuple)):
            yield from (item for item in value if isinstance(item, _CHILD_TYPES))
        elif isinstance(value, _CHILD_TYPES):
            yield value


def _walk(tree: nodes.MypyFile) -> Iterator[tuple[nodes.Node, nodes.FuncItem | None]]:
    """Every node of a module with the function around it."""
    stack: list[tuple[nodes.Node, nodes.FuncItem | None]] = [(tree, None)]
    seen: set[int] = set()
    while stack:
        node, func = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node, func
        inner = node if isinstance(node, nodes.FuncItem) else func
        stack.extend((child, inner) for child in _children(node))


def build_program(root: Path = ROOT, extra: Mapping[str, str] | None = None) -> build.BuildResult:
    """mypy's reading of PACKAGES (and of the `extra` modules, name: text), with the type of every expression.
    Modules are always read from their text (a module loaded from mypy's cache has no function bodies); what they
    import comes from the cache."""
    options = Options()
    parse_config_file(options, lambda: None, str(root / "pyproject.toml"), io.StringIO(), io.StringIO())
    options.export_types = True
    options.preserve_asts = True
    options.incremental = True
    options.cache_dir = str(root / ".mypy_cache" / "rbac-derivation")
    found = create_source_list([str(root / package) for package in PACKAGES], options)
    sources = [BuildSource(s.path, s.module, Path(s.path).read_text(), s.base_dir) for s in found if s.path]
    sources += [BuildSource(None, module, text, str(root)) for module, text in (extra or {}).items()]
    return build.build(sources, options)


class Program:
    """The program's calls, assignments and loops, and the values expressions may have."""

    def __init__(self, result: build.BuildResult) -> None:
        self.types = result.types
        self.modules = {name: state.tree for name, state in result.graph.items() if _ours(name) and state.tree}
        self.text = {name: (state.source or "").splitlines() for name, state in result.graph.items() if _ours(name)}
        self.calls: list[tuple[nodes.CallExpr, Site]] = []
        self.assigned: dict[int, list[tuple[nodes.Expression, Site]]] = {}
        self.iterated: dict[int, list[tuple[nodes.Expression | None, Site]]] = {}
        self.returns: dict[str, list[tuple[nodes.Expression, Site]]] = {}
        self.callers: dict[str, list[Caller]] = {}
        self.not_called: dict[str, list[str]] = {}
        self.blocking: list[tuple[nodes.Expression, Site]] = []
        self._active: set[tuple[int, int, int]] = set()
        self._pool_kinds: frozenset[object] | None = None
        partials: dict[int, tuple[str, nodes.CallExpr]] = {}
        walked = [(node, Site(module, func)) for module, tree in self.modules.items() for node, func in _walk(tree)]
        for node, site in walked:
            self._index(node, site, partials)
        self._index_callers(partials, walked)

    def _index(self, node: nodes.Node, site: Site, partials: dict[int, tuple[str, nodes.CallExpr]]) -> None:
        if isinstance(node, nodes.CallExpr):
            self.calls.append((node, site))
            self._mutation(node, site)
        elif isinstance(node, nodes.OperatorAssignmentStmt):
            self._add(node.lvalue, node.rvalue if self._is_container(node.lvalue) else _unknown(node), site)
        elif isinstance(node, nodes.AssignmentStmt):
            for target in node.lvalues:
                self._assign(target, node.rvalue, site, partials)
        elif isinstance(node, nodes.ForStmt):
            self._iterate(node.index, node.expr, site)
        elif isinstance(node, (nodes.GeneratorExpr, nodes.DictionaryComprehension)):
            for index, sequence in zip(node.indices, node.sequences, strict=True):
                self._iterate(index, sequence, site)
        elif isinstance(node, nodes.ReturnStmt) and node.expr is not None and site.func is not None:
            self.returns.setdefault(site.func.fullname, []).append((node.expr, site))
        elif isinstance(node, nodes.DictExpr) and any(
            isinstance(key, nodes.StrExpr) and key.value == "blockOwnerDeletion" for key, _ in node.items
        ):
            self.blocking.append((node, site))

    def _assign(
        self,
        target: nodes.Expression,
        value: nodes.Expression,
        site: Site,
        partials: dict[int, tuple[str, nodes.CallExpr]],
    ) -> None:
        var = self._variable(target)
        if isinstance(target, nodes.IndexExpr):  # container[key] = value
            self._add(target.base, _display(value), site)
        if var is None:
            if isinstance(target, (nodes.TupleExpr, nodes.ListExpr)):  # unpacked: not followed
                for item in target.items:
                    self._iterate(item, None, site)
            return
        if not isinstance(value, nodes.TempNode):  # a bare annotation assigns nothing
            self.assigned.setdefault(id(var), []).append((value, site))
        if isinstance(value, nodes.CallExpr) and self.target(value.callee) == "functools.partial" and value.args:
            wrapped = self.target(value.args[0])
            if wrapped is not None:
                partials[id(var)] = (wrapped, value)

    def _mutation(self, call: nodes.CallExpr, site: Site) -> None:
        """What a call adds to a container (append, add, insert, setdefault; extend, update), or gives a dataclass's
        field (dataclasses.replace)."""
        callee = call.callee
        if self.target(callee) == "dataclasses.replace" and call.args:
            owner = self._instance(call.args[0])
            for arg, name in zip(call.args[1:], call.arg_names[1:], strict=True):
                found = owner.type.get(name) if owner is not None and name else None
                if found is not None and isinstance(found.node, nodes.Var):
                    self.assigned.setdefault(id(found.node), []).append((arg, site))
        elif isinstance(callee, nodes.MemberExpr) and call.args and self._is_container(callee.expr):
            if callee.name in ("append", "add", "insert", "setdefault"):
                self._add(callee.expr, _display(call.args[-1]), site)
            elif callee.name in ("extend", "update"):
                self._add(callee.expr, call.args[0], site)

    def _is_container(self, expr: nodes.Expression) -> bool:
        instance = self._instance(expr)
        return (
            instance is not None
            and instance.type.fullname != "builtins.str"
            and any(instance.type.has_base(base) for base in ("typing.Iterable", "typing.Mapping"))
        )

    def _add(self, container: nodes.Expression, items: nodes.Expression, site: Site) -> None:
        var = self._variable(container)
        if var is not None:
            self.assigned.setdefault(id(var), []).append((items, site))

    def _iterate(self, index: nodes.Expression, sequence: nodes.Expression | None, site: Site) -> None:
        var = self._variable(index)
        if var is not None:
            self.iterated.setdefault(id(var), []).append((sequence, site))
        elif isinstance(index, (nodes.TupleExpr, nodes.ListExpr)):
            for item in index.items:
                self._iterate(item, None, site)

    def _variable(self, expr: nodes.Expression) -> nodes.Var | None:
        """The variable an expression names: a name, a module's attribute or an instance attribute."""
        if isinstance(expr, nodes.RefExpr) and isinstance(expr.node, nodes.Var):
            return expr.node
        if isinstance(expr, nodes.MemberExpr):
            if expr.def_var is not None:
                return expr.def_var
            owner = self._instance(expr.expr)
            found = owner.type.get(expr.name) if owner is not None else None
            if found is not None and isinstance(found.node, nodes.Var):
                return found.node
        return None

    def _instance(self, expr: nodes.Expression) -> types.Instance | None:
        found = types.get_proper_type(self.types.get(expr))
        return found if isinstance(found, types.Instance) else None

    def target(self, callee: nodes.Expression) -> str | None:
        """The full name of the function or class a callee expression names."""
        node = callee.node if isinstance(callee, nodes.RefExpr) else None
        if isinstance(node, nodes.Decorator):
            node = node.func
        if isinstance(node, (nodes.FuncDef, nodes.TypeInfo, nodes.OverloadedFuncDef)):
            return node.fullname
        found = types.get_proper_type(self.types.get(callee))
        if isinstance(found, types.CallableType) and found.definition is not None:
            return found.definition.fullname
        return None

    def _index_callers(
        self, partials: dict[int, tuple[str, nodes.CallExpr]], walked: Sequence[tuple[nodes.Node, Site]]
    ) -> None:
        callees: set[int] = set()
        for call, site in self.calls:
            callees.add(id(call.callee))
            if isinstance(call.callee, nodes.RefExpr) and id(call.callee.node) in partials:
                wrapped, partial = partials[id(call.callee.node)]
                self.callers.setdefault(wrapped, []).append(
                    Caller(
                        (*partial.args[1:], *call.args),
                        (*partial.arg_kinds[1:], *call.arg_kinds),
                        (*partial.arg_names[1:], *call.arg_names),
                        site,
                    )
                )
                if not wrapped.startswith(KUBE_CLIENT + "."):  # a request method wrapped is not a request followed
                    callees.add(id(partial.args[0]))
                continue
            name = self.target(call.callee)
            if name is not None:
                caller = Caller(tuple(call.args), tuple(call.arg_kinds), tuple(call.arg_names), site)
                self.callers.setdefault(name, []).append(caller)
        for node, site in walked:
            if isinstance(node, nodes.RefExpr) and id(node) not in callees:
                name = self.target(node) if not isinstance(node.node, nodes.Var) else None
                if name is not None:
                    self.not_called.setdefault(name, []).append(self.where(node, site))

    def where(self, expr: nodes.Context, site: Site) -> str:
        """`module:line: source` of an expression."""
        lines = self.text[site.module]
        source = lines[expr.line - 1][expr.column :] if 0 < expr.line <= len(lines) else ""
        if expr.end_line == expr.line and expr.end_column is not None:
            source = lines[expr.line - 1][expr.column : expr.end_column]
        return f"{site.module.replace('.', '/')}.py:{expr.line}: {source.strip()[:100]}"

    def values(self, expr: nodes.Expression, site: Site) -> frozenset[object]:
        """The values `expr` may have (constants, Records, Items, OWN_NAMESPACE); Unresolved if they are unknown."""
        key = (id(expr), id(site.func), id(site.caller))
        if key in self._active:  # a cycle adds nothing to what its other paths give
            return frozenset()
        self._active.add(key)
        try:
            return self._values(expr, site)
        except Unresolved:
            if self._typed(expr) == POOL_KIND:  # PoolKinds are constants: it is one of them
                return self.pool_kinds()
            if self._typed(expr) == f"Sequence[{POOL_KIND}]":
                return frozenset({Items(self.pool_kinds())})
            raise
        finally:
            self._active.discard(key)

    def _typed(self, expr: nodes.Expression) -> str:
        instance = self._instance(expr)
        if instance is None:
            return ""
        args = [types.get_proper_type(arg) for arg in instance.args]
        if instance.type.has_base("typing.Sequence") and len(args) == 1 and isinstance(args[0], types.Instance):
            return f"Sequence[{args[0].type.fullname}]"
        return instance.type.fullname

    def _values(self, expr: nodes.Expression, site: Site) -> frozenset[object]:
        if isinstance(expr, (nodes.StrExpr, nodes.IntExpr)):
            return frozenset({expr.value})
        if isinstance(expr, nodes.NameExpr) and expr.fullname in _CONSTANTS:
            return frozenset({_CONSTANTS[expr.fullname]})
        if isinstance(expr, nodes.ConditionalExpr):
            return self.values(expr.if_expr, site) | self.values(expr.else_expr, site)
        if isinstance(expr, (nodes.TupleExpr, nodes.ListExpr, nodes.SetExpr)):
            return frozenset({Items(_union(self.values(item, site) for item in expr.items))})
        if isinstance(expr, nodes.DictExpr):
            return frozenset({Items(_union(self.values(value, site) for _, value in expr.items))})
        if isinstance(expr, nodes.IndexExpr):
            return self.elements(expr.base, site)
        if isinstance(expr, nodes.CallExpr):
            return self._call_values(expr, site)
        if isinstance(expr, nodes.MemberExpr) and self._record_type(expr.expr):
            records = [value for value in self.values(expr.expr, site) if isinstance(value, Record)]
            if any(expr.name not in dict(record.fields) for record in records):
                raise Unresolved(f"{self.where(expr, site)} (a field the derivation does not keep)")
            return frozenset(record[expr.name] for record in records)
        var = self._variable(expr) if isinstance(expr, nodes.RefExpr) else None
        if var is not None:
            return self._variable_values(var, expr, site)
        raise Unresolved(self.where(expr, site))

    def elements(self, expr: nodes.Expression, site: Site) -> frozenset[object]:
        found = self.values(expr, site)
        if not all(isinstance(value, Items) for value in found):
            raise Unresolved(f"{self.where(expr, site)} (not a container of known values)")
        return _union(value.values for value in found if isinstance(value, Items))

    def assigned_values(self, var: nodes.Var) -> frozenset[object]:
        """The values a module constant is assigned."""
        return _union(self.values(value, where) for value, where in self.assigned.get(id(var), []))

    def _record_type(self, expr: nodes.Expression) -> bool:
        instance = self._instance(expr)
        return instance is not None and instance.type.fullname in RECORDS

    def _variable_values(self, var: nodes.Var, expr: nodes.Expression, site: Site) -> frozenset[object]:
        if var.fullname in BY_HAND:
            return frozenset({BY_HAND[var.fullname]})
        func = site.func
        if func is not None and any(argument.variable is var for argument in func.arguments):
            return self._parameter_values(func, var.name, site)
        found: set[object] = set()
        for value, where in self.assigned.get(id(var), []):
            found |= self.values(value, where)
        for sequence, where in self.iterated.get(id(var), []):
            if sequence is None:
                raise Unresolved(f"{self.where(expr, site)} (unpacked in {self.where(where.func or expr, where)})")
            found |= self.elements(sequence, where)
        info = None if var.info in (nodes.VAR_NO_INFO, nodes.FUNC_NO_INFO) else var.info
        if info is not None and "dataclass" in info.metadata and var.name in info.names:
            for caller in self.callers.get(info.fullname, []):
                found |= self._argument_values(caller, _dataclass_fields(info), var.name, None)
        elif not self.assigned.get(id(var)) and not self.iterated.get(id(var)):
            raise Unresolved(f"{self.where(expr, site)} (never assigned a known value)")
        return frozenset(found)

    def _parameter_values(self, func: nodes.FuncItem, name: str, site: Site) -> frozenset[object]:
        """The values a parameter is given by every call of its function (a class's constructor for __init__)."""
        if func.name == "<lambda>":
            raise Unresolved(f"{self.where(func, site)} (a lambda's parameter {name})")
        fullname = func.info.fullname if func.name == "__init__" and func.info else func.fullname
        if fullname in self.not_called:
            raise Unresolved(f"parameter {name} of {fullname}, which is passed on at {self.not_called[fullname][0]}")
        formals = list(func.arg_names)
        if isinstance(func, nodes.FuncDef) and func.info is not nodes.FUNC_NO_INFO and not func.is_static:
            formals = formals[1:]  # self or cls
        default = next((a.initializer for a in func.arguments if a.variable.name == name), None)
        callers = [site.caller] if site.caller is not None else self.callers.get(fullname, [])
        if not callers:
            raise Unresolved(f"parameter {name} of {fullname}, which the code never calls")
        found: set[object] = set()
        for caller in callers:
            found |= self._argument_values(caller, formals, name, (default, site) if default else None)
        return frozenset(found)

    def contexts(self, site: Site) -> list[Site]:
        """`site` once per call of its function (so that its parameters are taken together, as each call gives
        them), or as it is when the function is not only called."""
        func = site.func
        if func is None or func.name == "<lambda>":
            return [site]
        fullname = func.info.fullname if func.name == "__init__" and func.info else func.fullname
        callers = self.callers.get(fullname, [])
        if fullname in self.not_called or not callers:
            return [site]
        return [Site(site.module, func, caller) for caller in callers]

    def _argument_values(
        self,
        caller: Caller,
        formals: Sequence[str | None],
        name: str,
        default: tuple[nodes.Expression, Site] | None,
    ) -> frozenset[object]:
        actual = _actual(caller, formals, name)
        if actual is not None:
            return self.values(actual, caller.site)
        if default is None:
            return frozenset({None})  # a dataclass field or an optional parameter left to its default
        return self.values(*default)

    def _call_values(self, call: nodes.CallExpr, site: Site) -> frozenset[object]:
        name = self.target(call.callee)
        if name in RECORDS:
            return self._records(name, call, site)
        if isinstance(call.callee, nodes.MemberExpr) and call.callee.name == "get" and self._is_dict(call.callee.expr):
            default = self.values(call.args[1], site) if len(call.args) > 1 else frozenset({None})
            return self.elements(call.callee.expr, site) | default
        if name is not None and name in self.returns:
            return _union(self.values(value, where) for value, where in self.returns[name])
        raise Unresolved(self.where(call, site))

    def _is_dict(self, expr: nodes.Expression) -> bool:
        instance = self._instance(expr)
        return instance is not None and instance.type.has_base("typing.Mapping")

    def _records(self, cls: str, call: nodes.CallExpr, site: Site) -> frozenset[object]:
        formals = _dataclass_fields(self.types_info(cls))
        caller = Caller(tuple(call.args), tuple(call.arg_kinds), tuple(call.arg_names), site)
        fields = RECORDS[cls]
        choices = [self._argument_values(caller, formals, name, None) for name in fields]
        return frozenset(Record(cls, tuple(zip(fields, chosen, strict=True))) for chosen in itertools.product(*choices))

    def pool_kinds(self) -> frozenset[object]:
        """Every PoolKind the code constructs (the backends' constants): the values a PoolKind may have."""
        if self._pool_kinds is None:
            self._pool_kinds = frozenset()  # while they are followed, a PoolKind refers to no other
            constructions = [(c, site) for c, site in self.calls if self.target(c.callee) == POOL_KIND]
            self._pool_kinds = _union(self._records(POOL_KIND, call, site) for call, site in constructions)
        return self._pool_kinds

    def types_info(self, fullname: str) -> nodes.TypeInfo:
        module, _, name = fullname.rpartition(".")
        found = self.modules[module].names[name].node
        assert isinstance(found, nodes.TypeInfo), fullname
        return found


_CONSTANTS: dict[str, object] = {"builtins.None": None, "builtins.True": True, "builtins.False": False}


def _display(item: nodes.Expression) -> nodes.Expression:
    """A list display of one item (what adding `item` to a container adds)."""
    display = nodes.ListExpr([item])
    display.set_line(item)
    return display


def _unknown(at: nodes.Context) -> nodes.Expression:
    """An expression of no known value (an augmented assignment to a scalar)."""
    unknown = nodes.TempNode(types.AnyType(types.TypeOfAny.special_form))
    unknown.set_line(at)
    return unknown


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def _union(sets: Iterable[frozenset[object]]) -> frozenset[object]:
    return frozenset().union(*sets)


def _dataclass_fields(info: nodes.TypeInfo) -> list[str]:
    attributes: list[dict[str, Any]] = info.metadata["dataclass"]["attributes"]
    return [str(a["name"]) for a in attributes if a.get("is_in_init", True)]


def _actual(caller: Caller, formals: Sequence[str | None], name: str) -> nodes.Expression | None:
    """The argument a call gives to the parameter `name`, or None if the call leaves it to its default."""
    if any(kind in (nodes.ARG_STAR, nodes.ARG_STAR2) for kind in caller.kinds):
        raise Unresolved(f"{caller.site.module}: a call with *args or **kwargs (parameter {name})")
    positional = [arg for arg, kind in zip(caller.args, caller.kinds, strict=True) if kind == nodes.ARG_POS]
    for arg, kind, keyword in zip(caller.args, caller.kinds, caller.names, strict=True):
        if kind == nodes.ARG_NAMED and keyword == name:
            return arg
    position = list(formals).index(name)
    return positional[position] if position < len(positional) else None


class Deriver:
    """The requests of a Program: its KubeClient calls, and the finalizers its blocking owner references need."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.client = program.types_info(KUBE_CLIENT)

    def derive(self) -> Derivation:
        derivation = Derivation()
        for call, site in self.program.calls:
            if site.module in NOT_THE_CONTROLLER:
                continue
            where = self.program.where(call, site)
            try:
                method = self._request_method(call, site)
                if method and site.func is not None and site.func.fullname in TABLES:
                    found = self._table_requests(TABLES[site.func.fullname], method, site)
                else:
                    contexts = self.program.contexts(site) if method else []
                    found = [r for context in contexts for r in self._requests(call, context, method or "")]
            except Unresolved as error:
                derivation.unresolved.append(f"{where}: cannot follow {error}")
                continue
            for request in found:
                derivation.requests.setdefault(request, []).append(where)
        derivation.unresolved += self._bypasses()
        for expr, site in self.program.blocking:
            where = self.program.where(expr, site)
            try:
                for request in self._finalizers(site):
                    derivation.requests.setdefault(request, []).append(where)
            except Unresolved as error:
                derivation.unresolved.append(f"{where}: {error}")
        return derivation

    def _bypasses(self) -> list[str]:
        """Requests the derivation cannot see: a KubeClient request method passed on as a value (not called), and
        modules that import the Kubernetes client library instead of using KubeClient."""
        found = [
            f"{where}: KubeClient.{name.rpartition('.')[2]} passed on, not called: its requests cannot be followed"
            for name, places in self.program.not_called.items()
            if name.startswith(KUBE_CLIENT + ".") and name.rpartition(".")[2] in VERBS
            for where in places
            if not where.startswith("ipam_provider/runtime/kube/client.py:")
        ]
        for module, tree in self.program.modules.items():
            for imported in tree.imports:
                ids = [imported.id] if isinstance(imported, (nodes.ImportFrom, nodes.ImportAll)) else []
                ids += [name for name, _ in imported.ids] if isinstance(imported, nodes.Import) else []
                if module not in CLIENT_MODULES and any(i.split(".")[0] == "kubernetes_asyncio" for i in ids):
                    where = f"{module.replace('.', '/')}.py:{imported.line}"
                    found.append(f"{where}: imports kubernetes_asyncio; requests go through KubeClient only")
        return found

    def _request_method(self, call: nodes.CallExpr, site: Site) -> str | None:
        """The KubeClient method a call makes a request with, or None if it makes none."""
        callee = call.callee
        inside = site.func is not None and site.func.fullname.startswith(KUBE_CLIENT + ".")
        if not isinstance(callee, nodes.MemberExpr) or inside:  # KubeClient's own methods call each other
            return None
        if any(i.type.has_base(KUBE_CLIENT) for i in self._instances(callee.expr)):
            if callee.name in VERBS:
                return callee.name
            if callee.name not in NOT_REQUESTS:
                raise Unresolved(f"KubeClient.{callee.name}, a method this derivation does not know")
            return None
        if (
            callee.name in VERBS
            and call.args
            and any(i.type.fullname == RESOURCE for i in self._instances(call.args[0]))
        ):
            return callee.name  # a Resource handed to another client of the API server
        return None

    def _instances(self, expr: nodes.Expression) -> list[types.Instance]:
        found = types.get_proper_type(self.program.types.get(expr))
        items = found.items if isinstance(found, types.UnionType) else [found]
        proper = [types.get_proper_type(item) for item in items]
        return [item for item in proper if isinstance(item, types.Instance)]

    def _requests(self, call: nodes.CallExpr, site: Site, method: str) -> list[Request]:
        formals = self.client.get_method(method)
        assert isinstance(formals, nodes.FuncDef), method
        names = formals.arg_names[1:]
        caller = Caller(tuple(call.args), tuple(call.arg_kinds), tuple(call.arg_names), site)
        resources = self.program._argument_values(caller, names, "resource", None)
        if not resources or not all(isinstance(r, Record) and r.cls == RESOURCE for r in resources):
            raise Unresolved("its Resource")
        subresources = self._strings(caller, names, "subresource")
        if ANY in subresources:
            raise Unresolved("its subresource")
        namespaces, objects = self._strings(caller, names, "namespace"), self._strings(caller, names, "name")
        found = []
        for resource, sub, namespace, name in itertools.product(resources, subresources, namespaces, objects):
            assert isinstance(resource, Record)
            path = f"{resource['plural']}/{sub}" if sub else str(resource["plural"])
            scope = str(namespace) if namespace and resource["namespaced"] else ANY
            found.append(Request(VERBS[method], str(resource["group"]), path, scope, str(name or ANY)))
        return found

    def _table_requests(self, table: str, method: str, site: Site) -> list[Request]:
        module, _, constant = table.rpartition(".")
        var = self.program.modules[module].names[constant].node
        assignments = self.program.assigned.get(id(var), []) if isinstance(var, nodes.Var) else []
        found = []
        for value, where in assignments:
            if not isinstance(value, nodes.DictExpr):
                raise Unresolved(f"{table}, not a dict display")
            for written, plural in value.items:
                key = self._constant_tuple(written)
                if key is None:
                    raise Unresolved(f"{table}: a key that is not a (group, kind) tuple")
                groups = self.program.values(key.items[0], where)
                for group, name in itertools.product(groups, self.program.values(plural, where)):
                    found.append(Request(VERBS[method], str(group), str(name)))
        if not found:
            raise Unresolved(f"{table}, which holds no known kind")
        return found

    def _constant_tuple(self, expr: nodes.Expression | None) -> nodes.TupleExpr | None:
        """The tuple display `expr` is, or the one a constant it names is assigned."""
        if isinstance(expr, nodes.TupleExpr) and expr.items:
            return expr
        var = self.program._variable(expr) if isinstance(expr, nodes.RefExpr) else None
        assigned = self.program.assigned.get(id(var), []) if var is not None else []
        return self._constant_tuple(assigned[0][0]) if len(assigned) == 1 else None

    def _strings(self, caller: Caller, formals: Sequence[str | None], name: str) -> frozenset[str | None]:
        """The strings (None: not given) a call passes to `name`; ANY where they cannot be followed."""
        if name not in formals:
            return frozenset({None})
        try:
            found = self.program._argument_values(caller, formals, name, None)
        except Unresolved:
            return frozenset({ANY})
        strings = frozenset(value if value is None or isinstance(value, str) else ANY for value in found)
        return strings or frozenset({ANY})

    def _finalizers(self, site: Site) -> list[Request]:
        name = site.func.fullname if site.func is not None else site.module
        if name not in BLOCKING_OWNERS:
            raise Unresolved(f"{name} writes blockOwnerDeletion; say its owners in BLOCKING_OWNERS")
        owners: set[object] = set()
        for owner in BLOCKING_OWNERS[name]:
            if owner == "pools":
                owners |= self.program.pool_kinds()
                continue
            module, _, constant = owner.rpartition(".")
            var = self.program.modules[module].names[constant].node
            assert isinstance(var, nodes.Var), owner
            owners |= self.program.assigned_values(var)
        return [
            Request("update", str(owner["group"]), f"{owner['plural']}/finalizers")
            for owner in owners
            if isinstance(owner, Record)
        ]


def derive(root: Path = ROOT, extra: Mapping[str, str] | None = None) -> Derivation:
    """The requests the code under `root` makes; `extra` adds modules (name: text) to it, for tests."""
    return Deriver(Program(build_program(root, extra or {}))).derive()


ROLE_FILES = ("config/rbac/role.yaml", "config/rbac/leader_election_role.yaml")


def grants(documents: Iterable[Mapping[str, Any]]) -> list[Grant]:
    """Every verb on every resource (and resourceName) of the rules of Roles and ClusterRoles, as written."""
    found = []
    for document in documents:
        for rule in document.get("rules") or []:
            names = rule.get("resourceNames") or [ANY]
            pairs = itertools.product(rule.get("apiGroups") or [""], rule.get("resources") or [], rule["verbs"], names)
            found += [Grant(document["kind"], verb, group, resource, name) for group, resource, verb, name in pairs]
            urls = itertools.product(rule.get("nonResourceURLs") or [], rule["verbs"])
            found += [Grant(document["kind"], verb, "", url) for url, verb in urls]
    return found


def config_grants(root: Path = ROOT) -> list[Grant]:
    import yaml

    return grants(yaml.safe_load(Path(root, path).read_text()) for path in ROLE_FILES)


def coverers(request: Request, granted: Sequence[Grant]) -> list[Grant]:
    """The grants that allow `request`; for one in the controller's namespace, the Role's (the narrower) if any."""
    found = [grant for grant in granted if grant.covers(request)]
    if request.namespace == OWN_NAMESPACE and any(grant.role == "Role" for grant in found):
        found = [grant for grant in found if grant.role == "Role"]
    return found


def missing(requests: Iterable[Request], granted: Sequence[Grant]) -> list[Request]:
    """The requests no grant allows."""
    return sorted(request for request in requests if not coverers(request, granted))


def unused(requests: Iterable[Request], granted: Sequence[Grant]) -> list[Grant]:
    """The grants no request needs: every grant must be the one grant that allows some request (so a wildcard, a
    duplicate, or a ClusterRole grant of what the Role grants, is unused too)."""
    needed = {id(found[0]) for request in requests if len(found := coverers(request, granted)) == 1}
    return [grant for grant in granted if id(grant) not in needed]
