#!/usr/bin/env python3
"""Draw the imports between the project's own modules, and find circles and upward arrows.

    scripts/import_graph.py              every arrow, one per line: `a.b -> c.d  (line 12)`
    scripts/import_graph.py --dot        the same as a Graphviz digraph (| dot -Tsvg > imports.svg)
    scripts/import_graph.py --packages   the arrows between top-level packages only
    scripts/import_graph.py --check      the circles and the arrows against LAYERS; exit 1 if any

Every import counts: at module level, inside functions, and under `if TYPE_CHECKING:` (a
type-only import of a module above is still an arrow pointing up; the listing marks them).
Relative imports are resolved. `from p import m` points at p.m when m is a module of p, else
at p; `import p.m` points at p.m. Only arrows between the project's own modules are kept.
tests/test_import_graph.py runs the check (issue 18).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Which top-level packages each package may import (besides itself). llmgw_facility, the
#: operator CLI, is the top; the decider and the exporter share only llmgw_common.
LAYERS: dict[str, frozenset[str]] = {
    "llmgw_common": frozenset(),
    "exporter": frozenset({"llmgw_common"}),
    "decider": frozenset({"llmgw_common"}),
    "llmgw_sim": frozenset({"decider", "llmgw_common"}),
    "llmgw_facility": frozenset({"exporter", "decider", "llmgw_common", "llmgw_sim"}),
}


@dataclass(frozen=True, order=True)
class Arrow:
    """`source` imports `target`, first at `line` of the source's file."""

    source: str
    target: str
    line: int
    type_only: bool

    def __str__(self) -> str:
        note = ", type-only" if self.type_only else ""
        return f"{self.source} -> {self.target}  (line {self.line}{note})"


@dataclass(frozen=True)
class Graph:
    modules: frozenset[str]
    arrows: tuple[Arrow, ...]

    def successors(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {module: set() for module in self.modules}
        for arrow in self.arrows:
            out[arrow.source].add(arrow.target)
        return out


def find_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Each module's dotted name and file; a package's own name is its __init__.py."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """The lines of the bodies of `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            for statement in node.body:
                end = statement.end_lineno or statement.lineno
                lines.update(range(statement.lineno, end + 1))
    return lines


def _from_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The package or module a `from ... import` reads from, a relative one resolved."""
    if not node.level:
        return node.module or ""
    # Level 1 is the package the module is in; a package's __init__ is in itself.
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _targets(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Path]
) -> set[str]:
    """The project's modules an import statement points at.

    What follows `import` and `from` is always a module, so a name that is not one of ours is
    someone else's, or a C extension of ours (decider.placement._entry_index): no arrow.
    """
    if isinstance(node, ast.Import):
        found = {alias.name for alias in node.names}
    else:
        base = _from_base(module, is_package, node)
        if base not in modules:
            return set()
        found = {
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        }
    return {target for target in found if target in modules and target != module}


def build_graph(root: Path = ROOT, packages: Iterable[str] = LAYERS) -> Graph:
    """The arrows between the modules of `packages`, the folders of that name under `root`."""
    modules = find_modules(root, packages)
    arrows: dict[tuple[str, str], Arrow] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        type_only_lines = _type_checking_lines(tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(module, is_package, node, modules):
                arrow = Arrow(module, target, node.lineno, node.lineno in type_only_lines)
                known = arrows.get((module, target))
                # Keep a runtime import over a type-only one, then the first line.
                if known is None or (known.type_only, known.line) > (arrow.type_only, arrow.line):
                    arrows[(module, target)] = arrow
    return Graph(frozenset(modules), tuple(sorted(arrows.values())))


def circles(graph: Graph) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    successors = graph.successors()
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = lowlink[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(successors[module]):
            if target not in index:
                visit(target)
                lowlink[module] = min(lowlink[module], lowlink[target])
            elif target in on_stack:
                lowlink[module] = min(lowlink[module], index[target])
        if lowlink[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for module in sorted(successors):
        if module not in index:
            visit(module)
    return sorted(found, key=sorted)


def package_of(module: str) -> str:
    return module.split(".", 1)[0]


def layer_violations(graph: Graph, layers: Mapping[str, frozenset[str]] = LAYERS) -> list[Arrow]:
    """The arrows from one top-level package into another that `layers` does not allow."""
    return [
        arrow
        for arrow in graph.arrows
        if package_of(arrow.source) != package_of(arrow.target)
        and package_of(arrow.target) not in layers.get(package_of(arrow.source), frozenset())
    ]


def package_arrows(graph: Graph) -> dict[tuple[str, str], list[Arrow]]:
    """The arrows between top-level packages, with the module arrows that make each."""
    out: dict[tuple[str, str], list[Arrow]] = {}
    for arrow in graph.arrows:
        key = (package_of(arrow.source), package_of(arrow.target))
        if key[0] != key[1]:
            out.setdefault(key, []).append(arrow)
    return out


def to_dot(graph: Graph) -> str:
    lines = ["digraph imports {", "  rankdir=TB;", "  node [shape=box, fontsize=10];"]
    for package in sorted({package_of(module) for module in graph.modules}):
        lines.append(f'  subgraph "cluster_{package}" {{ label="{package}";')
        members = sorted(m for m in graph.modules if package_of(m) == package)
        lines.extend(f'    "{member}";' for member in members)
        lines.append("  }")
    in_circle = {module for circle in circles(graph) for module in circle}
    for arrow in graph.arrows:
        style = ["style=dashed"] if arrow.type_only else []
        if arrow.source in in_circle and arrow.target in in_circle:
            style.append("color=red")
        attributes = f" [{', '.join(style)}]" if style else ""
        lines.append(f'  "{arrow.source}" -> "{arrow.target}"{attributes};')
    lines.append("}")
    return "\n".join(lines)


def report(graph: Graph) -> list[str]:
    """What --check prints: each circle with its arrows, each arrow against LAYERS."""
    problems = []
    for circle in circles(graph):
        problems.append(f"circle of {len(circle)} modules: {', '.join(sorted(circle))}")
        problems.extend(
            f"  {arrow}"
            for arrow in graph.arrows
            if arrow.source in circle and arrow.target in circle
        )
    for arrow in layer_violations(graph):
        allowed = ", ".join(sorted(LAYERS[package_of(arrow.source)])) or "none of the others"
        problems.append(
            f"against the layers ({package_of(arrow.source)} imports {allowed}): {arrow}"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--dot", action="store_true", help="a Graphviz digraph")
    view.add_argument("--packages", action="store_true", help="arrows between packages")
    view.add_argument("--check", action="store_true", help="circles and upward arrows; exit 1")
    parser.add_argument("--root", type=Path, default=ROOT, help="the folder of the packages")
    args = parser.parse_args(argv)
    graph = build_graph(args.root)
    if args.dot:
        print(to_dot(graph))
    elif args.packages:
        for (source, target), arrows in sorted(package_arrows(graph).items()):
            print(f"{source} -> {target}  ({len(arrows)} arrows)")
    elif args.check:
        problems = report(graph)
        print("\n".join(problems) or f"{len(graph.modules)} modules, no circle, no upward arrow")
        return 1 if problems else 0
    else:
        print("\n".join(map(str, graph.arrows)))
        print(f"# {len(graph.modules)} modules, {len(graph.arrows)} arrows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
