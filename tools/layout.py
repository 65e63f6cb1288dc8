"""
C{python -m tools.layout [--root DIR] [--top N] [--docs | --check]}: the
package's shape, measured, and docs/architecture.md's generated section.

It reads the source (C{rmqha/} and C{tools/} under the root, by default
this checkout; point C{--root} at a C{git worktree} of an older commit for
a "before" column) with L{ast}, imports nothing, and prints Markdown:

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

C{--docs} rewrites the part of C{docs/architecture.md} between L{BEGIN}
and L{END} (nothing else) with L{docs_section}: sizes per package, the
module map (every module of C{rmqha/} and C{tools/} with the first
sentence of its docstring), the largest classes, and what each part
imports; C{--check} exits 1 if that part is not what C{--docs} would
write.  Nothing in it is typed by hand, and C{tests/test_layout.py} fails
when the committed section is stale.  Everything is found by walking the
two directories, so a module moved from one to the other (or renamed)
shows where it now is once the generator is run again.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tools._help import plain

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


# -- docs/architecture.md's generated section ----------------------------------

DOCS = os.path.join("docs", "architecture.md")
BEGIN = "<!-- generated by python -m tools.layout --docs: do not edit -->"
END = "<!-- end generated -->"
#: Classes at least this long are listed.
LARGE_CLASS = 300


def about(lines: int) -> str:
    """
    C{lines} to two significant figures (C{1,404} is C{1,400}, C{137} is
    C{140}; under 100 as it is), so that the generated section changes when
    a module's size does, not with every edit.
    """
    if lines < 100:
        return str(lines)
    return f"{round(lines, 2 - len(str(lines))):,}"


_MARKUP = re.compile(r"[CLIBU]\{([^{}]*)\}")


def summary(text: str | None) -> str:
    """
    The first sentence of a docstring's first paragraph, epytext markup as
    Markdown code, fit for a table cell.
    """
    if not text:
        return "(no docstring)"
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z(])", paragraph)[0].rstrip(":")
    sentence = _MARKUP.sub(lambda m: f"`{m.group(1)}`", sentence)
    if len(sentence) > 220:
        sentence = sentence[:220].rsplit(" ", 1)[0] + " …"
    return sentence.replace("|", "\\|")


@dataclass(frozen=True)
class CSource:
    path: str
    lines: int
    summary: str


def c_sources(root: str) -> list[CSource]:
    """
    The C files under the packages (the compiled accelerator), each with
    the first sentence of its opening comment.
    """
    found = []
    for package in PACKAGES:
        for directory, subdirs, files in os.walk(os.path.join(root, package)):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "_trial_temp", "build")))
            for filename in sorted(files):
                if not filename.endswith(".c"):
                    continue
                path = os.path.join(directory, filename)
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                comment = re.match(r"\s*/\*(.*?)\*/", source, re.DOTALL)
                text = ""
                if comment is not None:
                    text = "\n".join(line.strip().lstrip("*").strip() for line in comment.group(1).splitlines())
                found.append(CSource(os.path.relpath(path, root), source.count("\n"), summary(text)))
    return sorted(found, key=lambda c: c.path)


def part(module: str) -> str:
    """
    The part a module belongs to, for the imports table: a subpackage of
    C{rmqha} (C{rmqha.store}), a top-level module of C{rmqha}
    (C{rmqha.broker}), or C{tools}.
    """
    parts = module.split(".")
    if parts[0] != "rmqha":
        return parts[0]
    return ".".join(parts[:2])


def _directory(module: Module) -> str:
    return os.path.dirname(module.path).replace(os.sep, "/") + "/"


def docs_section(root: str) -> str:
    """
    The generated part of docs/architecture.md, markers not included.
    """
    found = modules(root)
    sources = c_sources(root)
    out = [
        "Measured by `python -m tools.layout --docs` from the source tree (no",
        "import); line counts as `wc -l`, to two significant figures (exact:",
        "`python -m tools.layout`). `tests/test_layout.py` fails when this",
        "section is not what the generator writes now: after changing the",
        "code, run `python -m tools.layout --docs` and commit the result.",
        "",
        "#### Sizes",
        "",
        "| package | modules | lines |",
        "|---|---:|---:|",
    ]
    directories = sorted({_directory(m) for m in found})
    for directory in directories:
        members = [m for m in found if _directory(m) == directory]
        out.append(f"| `{directory}` | {len(members)} | {about(sum(m.lines for m in members))} |")
    for source in sources:
        out.append(f"| `{source.path}` (C) | 1 | {about(source.lines)} |")
    for package in PACKAGES:
        total = sum(m.lines for m in found if m.name.split(".")[0] == package)
        total += sum(c.lines for c in sources if c.path.split(os.sep)[0] == package)
        count = sum(1 for m in found if m.name.split(".")[0] == package)
        count += sum(1 for c in sources if c.path.split(os.sep)[0] == package)
        out.append(f"| **`{package}/` in all** | {count} | **{about(total)}** |")

    out += [
        "",
        "#### The module map",
        "",
        "Every module, with the first sentence of its docstring.",
        "",
        "| module | lines | what it is |",
        "|---|---:|---|",
    ]
    rows = [(m.path.replace(os.sep, "/"), m.lines, summary(ast.get_docstring(m.tree))) for m in found]
    rows += [(c.path.replace(os.sep, "/"), c.lines, c.summary) for c in sources]
    for path, lines, text in sorted(rows):
        out.append(f"| `{path}` | {about(lines)} | {text} |")

    out += ["", f"#### Classes of {LARGE_CLASS} lines or more", ""]
    large = []
    for module in found:
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length >= LARGE_CLASS:
                    methods = sum(
                        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body
                    )
                    large.append((-length, node.name, module.name, methods))
    if large:
        out += ["| class | module | lines | methods |", "|---|---|---:|---:|"]
    else:
        out.append("None.")
    for length, name, module_name, methods in sorted(large):
        out.append(f"| `{name}` | `{module_name}` | {about(-length)} | {methods} |")
    broker = find_class(found, "Broker")
    if broker is not None:
        for item in broker[1].body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                a = item.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - 1
                count += (a.vararg is not None) + (a.kwarg is not None)
                out += ["", f"`Broker.__init__` takes {count} parameters (`self` not counted)."]

    known = {m.name for m in found}
    graph = {m.name: imports(m, known) for m in found}
    components = cycles(graph)
    out += ["", "#### Imports", ""]
    if components:
        out.append(f"**{len(components)} import cycle(s)**:")
        out.append("")
        for component in components:
            out.append("- " + " ↔ ".join(f"`{name}`" for name in component))
    else:
        out.append(
            "**0 import cycles** (every import counts, function-local and"
            " `TYPE_CHECKING` ones included)."
        )
    out += [
        "",
        "What each part imports from the others (a part is a subpackage of",
        "`rmqha`, a top-level module of it, or `tools`):",
        "",
        "| part | imports |",
        "|---|---|",
    ]
    parts: dict[str, set[str]] = {}
    for name, targets in graph.items():
        parts.setdefault(part(name), set()).update(part(t) for t in targets)
    for name in sorted(parts):
        others = sorted(parts[name] - {name})
        listed = ", ".join(f"`{o}`" for o in others) if others else "nothing"
        out.append(f"| `{name}` | {listed} |")
    return "\n".join(out) + "\n"


def splice(text: str, section: str) -> str:
    """
    C{text} with what lies between its L{BEGIN} and L{END} lines replaced
    by C{section}.

    @raise ValueError: the markers are not there exactly once each, in
        that order.
    """
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"{DOCS} must hold {BEGIN!r} and {END!r} once each")
    head, rest = text.split(BEGIN)
    if END not in rest:
        raise ValueError(f"{END!r} comes before {BEGIN!r}")
    tail = rest.split(END)[1]
    return f"{head}{BEGIN}\n{section}{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.layout", description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("--root", default=".", help="a checkout (default: the current directory)")
    parser.add_argument("--top", type=int, default=10, help="how many of the longest functions (default 10)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--docs", action="store_true", help=f"rewrite {DOCS}'s generated section")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {DOCS}'s generated section is stale")
    options = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(options.root, "rmqha")):
        parser.error(f"--root {options.root!r}: no rmqha/ package there")
    if not (options.docs or options.check):
        sys.stdout.write(report(options.root, options.top))
        return 0
    path = os.path.join(options.root, DOCS)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        wanted = splice(text, docs_section(options.root))
    except ValueError as e:
        parser.exit(2, f"{path}: {e}\n")
    if wanted == text:
        return 0
    if options.check:
        sys.stderr.write(f"{path}: the generated section is stale: run python -m tools.layout --docs\n")
        return 1
    with open(path, "w", encoding="utf-8") as f:
        f.write(wanted)
    sys.stdout.write(f"{path}: generated section rewritten\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
