"""Inline Python functions, with everything they reference, into one standalone source text.

A reproducer must run with torch (plus the vendor's extension) alone, not adaptcheck. Yet
its numbers must be exactly the check's: the same input generator, the same float64
reference kernel, the same comparison. So instead of rewriting that code (and letting it
drift), :class:`Bundle` copies it: for each root function it takes the source of its
defining statement (``inspect``/``ast``), finds the module-level names that statement
reads (``symtable``, so locals never count), and recursively adds their definitions:

* a function, class or module-level assignment of an *inlined* module (adaptcheck,
  reference_kernels, tests, any code not installed in site-packages) is copied;
* a name bound by an import of an *external* module (the standard library, torch, numpy,
  the vendor's extension: what ``python -I`` can import) becomes the same import line;
* ``mod.attr`` where ``mod`` is an inlined module (``ref.silu``) is rewritten to the
  copied definition of ``attr``.

Names are kept as in the source unless two different definitions want the same one; the
later is then renamed ``<module>_<name>`` everywhere it is used. Annotations become strings
(the output starts with ``from __future__ import annotations``), so type-only imports are
never needed. Definitions come out dependencies first. Comments are not kept (the code is
re-printed from its syntax tree); docstrings are.

What cannot be inlined faithfully raises :class:`BundleError` instead of producing a
script that would compute something else: a closure, a lambda, a function whose module
source is unavailable, an import of an inlined module inside a function body.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import symtable
import sys
import sysconfig
import textwrap
import types
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from adaptcheck.base.errors import AdaptcheckError

INLINED_PACKAGES = ("adaptcheck", "reference_kernels", "tests")
"""Top-level packages always copied, even where they happen to be installed."""


class BundleError(AdaptcheckError):
    """A definition cannot be copied into a standalone script (the reason says which and why)."""


@lru_cache(maxsize=1)
def _site_dirs() -> tuple[str, ...]:
    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    paths.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return tuple(sorted(str(Path(p).resolve()) for p in paths))


def is_external(module_name: str) -> bool:
    """True when ``python -I`` can import ``module_name`` without adaptcheck's source tree."""
    top = module_name.split(".")[0]
    if top in INLINED_PACKAGES or top == "__main__":
        return False
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return True
    module = sys.modules.get(top)
    if module is None:
        try:
            module = importlib.import_module(top)
        except ImportError:
            return False
    origin = getattr(module, "__file__", None)
    if origin is None:  # namespace package or built-in
        paths = list(getattr(module, "__path__", []))
        origin = paths[0] if paths else None
    if origin is None:
        return True
    resolved = str(Path(origin).resolve())
    return resolved.startswith((*_site_dirs(), sys.base_prefix))


@lru_cache(maxsize=64)
def _module_tree(module_name: str) -> tuple[ast.Module, dict[str, ast.stmt]]:
    """The parsed module and its top-level binding statements by bound name."""
    module = sys.modules[module_name]
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError) as exc:
        raise BundleError(f"no source for module {module_name}: {exc}") from None
    tree = ast.parse(source)
    bindings: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        for name in _bound_names(stmt):
            bindings[name] = stmt
    return tree, bindings


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return [stmt.target.id]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name.split(".")[0]) for a in stmt.names]
    return []


class _StringAnnotations(ast.NodeTransformer):
    """Annotations → string constants: never evaluated, so their names need no definition."""

    def _str(self, node: ast.expr | None) -> ast.expr | None:
        if node is None or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            return node
        return ast.Constant(ast.unparse(node))

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = self._str(node.annotation)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = self._str(node.returns)
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        node.annotation = self._str(node.annotation)  # type: ignore[assignment]
        self.generic_visit(node)
        return node


def _global_reads(source: str) -> tuple[set[str], set[str]]:
    """(module-level names read by ``source``, names bound locally in any of its scopes)."""
    table = symtable.symtable(source, "<bundle>", "exec")
    reads: set[str] = set()
    local: set[str] = set()
    for sym in table.get_symbols():
        if sym.is_referenced():
            reads.add(sym.get_name())
    stack = list(table.get_children())
    while stack:
        t = stack.pop()
        stack.extend(t.get_children())
        for sym in t.get_symbols():
            if sym.is_global() and sym.is_referenced():
                reads.add(sym.get_name())
            elif sym.is_local() or sym.is_parameter():
                local.add(sym.get_name())
    return reads, local


@dataclass
class _Def:
    key: tuple[str, str]
    name: str
    text: str


@dataclass
class Bundle:
    """Collects definitions; :meth:`source` prints them, imports first."""

    overrides: dict[tuple[str, str], str] = field(default_factory=dict)
    """(module, name) → replacement source (a ``def``/assignment binding ``name``), for
    definitions that read state a script does not have (the fp8 flavour context variable)."""
    _imports: dict[str, str] = field(default_factory=dict)  # emitted name → import line
    _defs: list[_Def] = field(default_factory=list)
    _names: dict[tuple[str, str], str] = field(default_factory=dict)  # definition key → emitted name
    _taken: dict[str, tuple[str, str]] = field(default_factory=dict)  # emitted name → key
    _busy: set[tuple[str, str]] = field(default_factory=set)

    # ------------------------------------------------------------------ public
    def reserve(self, name: str, key: tuple[str, str] | None = None) -> None:
        """Keep ``name`` for the script's own code (``key`` None) or for one definition
        (``key`` = :meth:`key_of` it): any other definition wanting it is renamed."""
        key = key or ("<script>", name)
        self._taken[name] = key
        if key[0] != "<script>":
            self._names.setdefault(key, name)

    @staticmethod
    def key_of(obj: Any) -> tuple[str, str] | None:
        """The key a module-level function or class of an inlined module is filed under."""
        module_name = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        if not module_name or not qualname or is_external(module_name) or "." in qualname or "<" in qualname:
            return None
        return (module_name, qualname)

    def add_object(self, obj: Any, label: str) -> str:
        """Add a callable (or class) and return the name it has in the bundle."""
        if isinstance(obj, types.MethodType):
            raise BundleError(f"{label}: a bound method cannot be inlined; use a module-level function")
        module_name = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
        if not module_name or not qualname:
            raise BundleError(f"{label}: {obj!r} has no module and name to inline or import it by")
        if is_external(module_name):
            return self._external_object(obj, module_name, qualname, label)
        if "<" in qualname or "." in qualname:
            raise BundleError(f"{label}: {module_name}.{qualname} is not a module-level definition (closure,"
                              " lambda or method); a reproducer can only inline module-level functions")
        module = sys.modules.get(module_name)
        if module is None or getattr(module, qualname, None) is not obj:
            raise BundleError(f"{label}: {module_name}.{qualname} is not reachable by that name")
        return self._add(module_name, qualname)

    def source(self) -> str:
        """The bundled code: ``from __future__``, imports, then definitions in dependency order."""
        lines = ["from __future__ import annotations", ""]
        lines += sorted(self._imports.values(), key=lambda s: (not s.startswith("import "), s))
        out = "\n".join(lines) + "\n"
        for d in self._defs:
            out += f"\n\n# -- from {d.key[0]} ({d.key[1]})\n{d.text.rstrip()}\n"
        return out

    # ------------------------------------------------------------------ naming
    def _claim(self, key: tuple[str, str], wanted: str) -> str:
        if key in self._names:
            return self._names[key]
        name = wanted
        if name in self._taken and self._taken[name] != key:
            name = f"{key[0].split('.')[-1]}_{wanted}".lstrip("_")
            n = 2
            while name in self._taken and self._taken[name] != key:
                name = f"{key[0].split('.')[-1]}_{wanted}_{n}"
                n += 1
        self._taken[name] = key
        self._names[key] = name
        return name

    def _import(self, key: tuple[str, str], wanted: str, module: str, attr: str | None) -> str:
        name = self._claim(key, wanted)
        if attr is None:
            line = f"import {module}" if name == module else f"import {module} as {name}"
        else:
            line = f"from {module} import {attr}" + ("" if name == attr else f" as {name}")
        self._imports[name] = line
        return name

    def _external_object(self, obj: Any, module_name: str, qualname: str, label: str) -> str:
        candidates = [(module_name, qualname)]
        name = getattr(obj, "__name__", qualname.split(".")[-1])
        for mod in ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft", "math", "numpy"):
            candidates.append((mod, name))
        for mod, attr in candidates:
            if "." in attr or "<" in attr:
                continue
            try:
                if getattr(importlib.import_module(mod), attr) is obj:
                    return self._import(("ext", f"{mod}.{attr}"), attr, mod, attr)
            except (ImportError, AttributeError):
                continue
        raise BundleError(f"{label}: cannot find an import path for {module_name}.{qualname}")

    # ------------------------------------------------------------------ definitions
    def _add(self, module_name: str, name: str) -> str:
        key = (module_name, name)
        if any(d.key == key for d in self._defs):
            return self._names[key]
        if key in self._busy:  # recursion: the name is claimed; its text comes when the outer call ends
            return self._names[key]
        emitted = self._claim(key, name)
        self._busy.add(key)
        try:
            text = self._definition_text(module_name, name, emitted)
        finally:
            self._busy.discard(key)
        self._defs.append(_Def(key, emitted, text))
        return emitted

    def _definition_text(self, module_name: str, name: str, emitted: str) -> str:
        module = sys.modules[module_name]
        if key_src := self.overrides.get((module_name, name)):
            stmt = ast.parse(textwrap.dedent(key_src)).body
            return self._rewrite(module, ast.Module(body=stmt, type_ignores=[]), {name: emitted})
        _, bindings = _module_tree(module_name)
        found = bindings.get(name)
        if found is None:
            raise BundleError(f"{module_name}.{name}: no top-level definition found to inline")
        if isinstance(found, (ast.Import, ast.ImportFrom)):
            raise BundleError(f"{module_name}.{name} is an import, not a definition")  # handled by _resolve
        if isinstance(found, (ast.Assign, ast.AnnAssign)) and len(_bound_names(found)) != 1:
            raise BundleError(f"{module_name}.{name}: a multiple assignment cannot be inlined")
        node = ast.parse(ast.unparse(found)).body[0]  # a private copy
        return self._rewrite(module, ast.Module(body=[node], type_ignores=[]), {name: emitted})

    def _rewrite(self, module: types.ModuleType, tree: ast.Module, own: dict[str, str]) -> str:
        """Resolve every global ``tree`` reads in ``module`` and rename to the emitted names."""
        tree = _StringAnnotations().visit(tree)
        ast.fix_missing_locations(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if isinstance(node, ast.ImportFrom) and node.level:
                    raise BundleError(f"{module.__name__}: relative import inside a function cannot be inlined")
                if mod and not is_external(mod):
                    raise BundleError(f"{module.__name__}: a function imports {mod} inside its body; a"
                                      " reproducer cannot inline that import")
        reads, local = _global_reads(ast.unparse(tree))
        renames: dict[str, str] = dict(own)
        module_aliases: dict[str, types.ModuleType] = {}
        for name in sorted(reads - set(own)):
            resolved = self._resolve(module, name)
            if isinstance(resolved, types.ModuleType):
                module_aliases[name] = resolved
            elif resolved is not None:
                renames[name] = resolved
        clash = {n for n, e in renames.items() if n != e} & local
        if clash:
            raise BundleError(f"{module.__name__}: {sorted(clash)} are both local variables and renamed globals")
        tree = _Renamer(renames, module_aliases, self).visit(tree)
        return ast.unparse(ast.fix_missing_locations(tree))

    def _resolve(self, module: types.ModuleType, name: str) -> str | types.ModuleType | None:
        """Emitted name for global ``name`` of ``module``; an inlined module object for
        ``mod.attr`` rewriting; None for builtins."""
        if name not in vars(module):
            if hasattr(builtins, name) or name in ("__name__", "__file__"):
                return None
            raise BundleError(f"{module.__name__}: {name!r} is not defined at module level")
        value = vars(module)[name]
        _, bindings = _module_tree(module.__name__)
        stmt = bindings.get(name)
        if isinstance(value, types.ModuleType):
            if is_external(value.__name__):
                return self._import(("ext", value.__name__), name, value.__name__, None)
            return value
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            origin = stmt.module if isinstance(stmt, ast.ImportFrom) else None
            if isinstance(stmt, ast.ImportFrom) and stmt.level:
                origin = importlib.util.resolve_name("." * stmt.level + (stmt.module or ""), module.__package__)
            if origin and is_external(origin):
                attr = next(a.name for a in stmt.names if (a.asname or a.name) == name)
                return self._import(("ext", f"{origin}.{attr}"), name, origin, attr)
            return self._resolve_object(value, f"{module.__name__}.{name}")
        if (module.__name__, name) in self.overrides or stmt is not None:
            return self._add(module.__name__, name)
        raise BundleError(f"{module.__name__}: cannot tell where {name!r} is defined")

    def _resolve_object(self, value: Any, label: str) -> str:
        """An object imported from another inlined module: inline it where it is defined."""
        home = getattr(value, "__module__", None)
        qual = getattr(value, "__qualname__", None)
        if home and qual and sys.modules.get(home) is not None and getattr(sys.modules[home], qual, None) is value:
            if is_external(home):
                return self._external_object(value, home, qual, label)
            return self._add(home, qual)
        raise BundleError(f"{label}: an imported value that is not a module-level function or class")


class _Renamer(ast.NodeTransformer):
    def __init__(self, renames: dict[str, str], modules: dict[str, types.ModuleType], bundle: Bundle) -> None:
        self.renames, self.modules, self.bundle = renames, modules, bundle

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.modules:
            raise BundleError(f"module {self.modules[node.id].__name__} is used as a value ({node.id}); only"
                              f" {node.id}.<attribute> can be inlined")
        if node.id in self.renames:
            node.id = self.renames[node.id]
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id in self.modules:
            target = self.modules[node.value.id]
            value = getattr(target, node.attr)
            if isinstance(value, types.ModuleType):
                raise BundleError(f"{target.__name__}.{node.attr}: nested module attributes cannot be inlined")
            emitted = self.bundle._resolve(target, node.attr)
            if not isinstance(emitted, str):
                raise BundleError(f"{target.__name__}.{node.attr} cannot be inlined")
            return ast.copy_location(ast.Name(id=emitted, ctx=node.ctx), node)
        self.generic_visit(node)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if node.name in self.renames:
            node.name = self.renames[node.name]
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        if node.name in self.renames:
            node.name = self.renames[node.name]
        self.generic_visit(node)
        return node
