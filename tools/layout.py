"""
C{python -m tools.layout [--root DIR] [--top N]}: the package's shape,
measured, for docs/architecture.md's before/after table.

It reads the source (C{rmqha/} and C{tools/} under the root, by default
this checkout; point C{--root} at a C{git worktree} of an older commit for
the "before" column) with L{ast}, imports nothing, and prints Markdown:

- every module's line count (as C{wc -l} counts them);
- the N longest functions (methods and nested functions included, named
  C{Class.method}), from the C{def} line to the last line of the body,
  docstring included, decorators not;
- the import cycles among the project's modules: every import counts,
  function-local and C{TYPE_CHECKING} ones included, each edge to the
  module named and to the submodules a C{from package import name}
  names; a cycle is a strongly connected component of two or more
  modules;
- C{CommitLog}'s method count and C{Broker.__init__}'s parameter count
  (C{self} not counted), wherever those classes live.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

PACKAGES = ("rmqha", "tools")


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. rmqha.store.commitlog
    path: str  # relative to the root, e.g. rmqha/store/commitlog.py
    is_package: bool
    lines: int
    tree: ast.Module


def modules(root: str) -> list[Module]:
    """
    The project's modules under C{root}, sorted by path.
    """
    found = []
    for package in PACKAGES:
        top = os.path.join(root, package)
        for directory, subdirs, files in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "_trial_temp")) and d != "__pycache__")
            for filename in sorted(files):
                if not filename.endswith(".py"):
                    continue
                path = os.path.join(directory, filename)
                relative = os.path.relpath(path, root)
                parts = relative[: -len(".py")].split(os.sep)
                is_package = parts[-1] == "__init__"
                if is_package:
                    parts = parts[:-1]
                with open(path, "rb") as f:
                    source = f.read()
                found.append(
                    Module(
                        name=".".join(parts),
                        path=relative,
                        is_package=is_package,
                        lines=source.count(b"\n"),
                        tree=ast.parse(source, relative),
                    )
                )
    return sorted(found, key=lambda m: m.path)


@dataclass(frozen=True)
class Function:
    qualname: str
    module: str
    lines: int


def functions(module: Module) -> Iterator[Function]:
    """
    Every function and method of C{module}, nested ones included.
    """

    def walk(node: ast.AST, prefix: str) -> Iterator[Function]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                assert child.end_lineno is not None
                yield Function(name, module.name, child.end_lineno - child.lineno + 1)
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
            else:
                yield from walk(child, prefix)

    return walk(module.tree, "")


def imports(module: Module, known: set[str]) -> set[str]:
    """
    The project modules C{module} imports, anywhere in its body.
    """
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    targets.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name in known:
                targets.add(name)
            for alias in node.names:
                if f"{name}.{alias.name}" in known:
                    targets.add(f"{name}.{alias.name}")
    targets.discard(module.name)
    return targets


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """
    The strongly connected components of two or more modules (Tarjan).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def find_class(found: Sequence[Module], name: str) -> tuple[Module, ast.ClassDef] | None:
    for module in found:
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
    return None


def report(root: str, top: int) -> str:
    found = modules(root)
    out = [f"# Layout of {os.path.abspath(root)}", ""]

    out += ["## Module line counts", "", "| module | lines |", "|---|---:|"]
    for module in found:
        out.append(f"| `{module.path}` | {module.lines} |")
    for package in PACKAGES:
        total = sum(m.lines for m in found if m.name.split(".")[0] == package)
        out.append(f"| **{package}/ total** | {total} |")

    out += ["", f"## The {top} longest functions", "", "| function | module | lines |", "|---|---|---:|"]
    every = [f for module in found for f in functions(module)]
    every.sort(key=lambda f: (-f.lines, f.module, f.qualname))
    for function in every[:top]:
        out.append(f"| `{function.qualname}` | `{function.module}` | {function.lines} |")

    known = {m.name for m in found}
    graph = {m.name: imports(m, known) for m in found}
    components = cycles(graph)
    out += ["", f"## Import cycles: {len(components)}", ""]
    for component in components:
        out.append("- " + " ↔ ".join(f"`{name}`" for name in component))

    out += ["", "## Classes", ""]
    commitlog = find_class(found, "CommitLog")
    if commitlog is not None:
        module, node = commitlog
        methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        assert node.end_lineno is not None
        out.append(
            f"- `CommitLog` (`{module.name}`): {len(methods)} methods,"
            f" {node.end_lineno - node.lineno + 1} lines"
        )
    broker = find_class(found, "Broker")
    if broker is not None:
        module, node = broker
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                a = item.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - 1
                count += (a.vararg is not None) + (a.kwarg is not None)
                assert item.end_lineno is not None
                out.append(
                    f"- `Broker.__init__` (`{module.name}`): {count} parameters,"
                    f" {item.end_lineno - item.lineno + 1} lines"
                )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.layout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=".", help="a checkout (default: the current directory)")
    parser.add_argument("--top", type=int, default=10, help="how many of the longest functions (default 10)")
    options = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(options.root, "rmqha")):
        parser.error(f"--root {options.root!r}: no rmqha/ package there")
    sys.stdout.write(report(options.root, options.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
