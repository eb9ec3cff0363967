"""No import cycles between the package's modules: every import of a csd_kernels module (top level or inside a
function), read from the source, forms a graph without cycles. Packages (__init__.py) are left out: a package
importing its own submodules is how a package works."""

import ast
import pathlib

import csd_kernels

ROOT = pathlib.Path(csd_kernels.__file__).parent


def _modules() -> dict:
    """{dotted name: (path, is_package)} of every module under csd_kernels/."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _imported(node, module: str, is_package: bool, modules: dict) -> set:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    found = set()
    for alias in node.names:
        name = f"{target}.{alias.name}"
        found.add(name if name in modules else target)
    return {name for name in found if name in modules}


def import_graph() -> dict:
    modules = _modules()
    graph = {}
    for module, (path, is_package) in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            edges |= _imported(node, module, is_package, modules)
        graph[module] = {m for m in edges if m != module and not modules[m][1]}
    return {m: edges for m, edges in graph.items() if not modules[m][1]}


def find_cycle(graph: dict):
    """One cycle as a list of modules, or None (depth-first search with colours)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_relative_and_function_level_imports():
    graph = import_graph()
    assert "csd_kernels.testing" in graph["csd_kernels.bench.op"]  # from ..testing import make_case
    assert "csd_kernels.bench.op" in graph["csd_kernels.bench.cases"]  # from csd_kernels.bench import op as bench
    assert "csd_kernels.bench.frontier" in graph["csd_kernels.cli.commands"]  # from ..bench import frontier


def test_no_import_cycles():
    assert find_cycle(import_graph()) is None
