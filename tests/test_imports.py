"""The package's imports, read from the source (top level or inside a function):

* no cycles between its modules (packages, __init__.py, are left out: a package importing its own submodules is how
  a package works);
* layers in one direction (:data:`MAY_IMPORT`, the table docs/development.md draws): reference imports no layer,
  backends use reference, ops use both, decoding uses ops and models (never cli / runner), models never decoding;
* a ``_private`` name stays in its module: no other module imports it or reads it off an imported module."""

import ast
import pathlib

import csd_kernels

ROOT = pathlib.Path(csd_kernels.__file__).parent


def _modules(root: pathlib.Path = ROOT) -> dict:
    """{dotted name: (path, is_package)} of every module under ``root`` (csd_kernels/)."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _source(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The dotted module a ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(node, module: str, is_package: bool, modules: dict) -> set:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if not isinstance(node, ast.ImportFrom):
        return set()
    target = _source(node, module, is_package)
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


# ---------------------------------------------------------------------------------------------------- layers
# Which layers each layer may import (its own is always allowed). A layer is a subpackage of csd_kernels, or one of
# its top-level modules: "csd_kernels" (the package's front, __init__.py), "testing", "__main__", and the torch-free
# leaves every layer may read: "constants" (shared names and defaults), "_lazy" (lazily loaded package names) and
# "config" (GenerationConfig and its rules, the acceptance rules' and the modes' tables: models give their defaults as
# one, so it sits below models; it imports constants only), "fileio" (the files a command reads and writes, with
# one-line errors) and "text_table" (fixed-width tables of the reports). Backends are reached only through ops; the
# top row (zoo, bench, runner, cli) builds on everything below it.
_LEAVES = {"constants", "_lazy", "config", "fileio", "text_table"}
MAY_IMPORT = {
    "constants": set(),
    "_lazy": set(),
    "fileio": set(),
    "text_table": set(),
    "config": {"constants"},
    "reference": {*_LEAVES},
    "backends": {*_LEAVES, "reference"},
    "ops": {*_LEAVES, "config", "reference", "backends"},
    "testing": {*_LEAVES, "reference", "ops"},
    "models": {*_LEAVES, "config", "reference", "ops"},
    "decoding": {*_LEAVES, "config", "reference", "ops", "models"},
    "csd_kernels": {*_LEAVES, "config", "ops", "decoding", "models"},
    "zoo": {*_LEAVES, "config", "reference", "ops", "models", "decoding"},
    "bench": {*_LEAVES, "config", "reference", "ops", "models", "decoding", "testing", "zoo"},
    "runner": {*_LEAVES, "config", "reference", "ops", "models", "decoding", "zoo"},
    "cli": {*_LEAVES, "config", "csd_kernels", "reference", "ops", "models", "decoding", "zoo", "bench", "runner"},
    "integrations": {*_LEAVES, "config", "reference", "ops", "models", "decoding"},  # other engines' signatures
    "__main__": {"cli"},
}
PRIVATE_ALLOWED = {"_C"}  # the compiled extension's module name


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(modules: dict):
    """(module, line, imported module) for every import of a csd_kernels module, packages included."""
    for module, (path, is_package) in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            for target in sorted(_imported(node, module, is_package, modules)):
                yield module, getattr(node, "lineno", 0), target


def wrong_direction(modules: dict) -> list[str]:
    """Imports that a layer may not make, as "module:line imports target"."""
    return [f"{module}:{line} imports {target}" for module, line, target in _imports(modules)
            if layer(target) != layer(module) and layer(target) not in MAY_IMPORT.get(layer(module), set())]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PRIVATE_ALLOWED


def private_imports(modules: dict) -> list[str]:
    """``from x import _name`` from another module, and ``x._name`` read off an imported csd_kernels module."""
    found = []
    for module, (path, is_package) in sorted(modules.items()):
        tree = ast.parse(path.read_text())
        aliases = {}  # local name -> the csd_kernels module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases.update({alias.asname: alias.name for alias in node.names if alias.asname})
            elif isinstance(node, ast.ImportFrom):
                source = _source(node, module, is_package)
                for alias in node.names:
                    if _private(alias.name) and source != module:
                        found.append(f"{module}:{node.lineno} imports {alias.name} from {source}")
                    if f"{source}.{alias.name}" in modules:
                        aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
        aliases = {name: target for name, target in aliases.items() if target in modules and target != module}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr) \
                    and node.value.id in aliases:
                found.append(f"{module}:{node.lineno} reads {node.attr} of {aliases[node.value.id]}")
    return found


def test_every_layer_is_in_the_table():
    layers = {layer(module) for module in _modules()}
    assert layers == set(MAY_IMPORT), "place a new layer in MAY_IMPORT"
    assert find_cycle(MAY_IMPORT) is None


def test_layers_import_in_one_direction():
    assert wrong_direction(_modules()) == []


def test_no_private_name_leaves_its_module():
    assert private_imports(_modules()) == []


def test_a_wrong_direction_and_a_private_import_are_found(tmp_path):
    root = tmp_path / "csd_kernels"
    files = {
        "__init__.py": "",
        "reference/__init__.py": "from .verify import verify\n",
        "reference/verify.py": "def verify(): ...\ndef _helper(): ...\n",
        "models/__init__.py": "",
        "models/base.py": "def f():\n    from ..decoding import step\n",  # models never import decoding
        "decoding/__init__.py": "",
        "decoding/step.py": "from ..reference.verify import _helper\n",  # private, across packages
        "decoding/eager.py": "from ..reference import verify as v\nv._helper()\nimport csd_kernels.cli\n",
        "cli/__init__.py": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    modules = _modules(root)
    assert wrong_direction(modules) == ["csd_kernels.decoding.eager:3 imports csd_kernels.cli",
                                        "csd_kernels.models.base:2 imports csd_kernels.decoding.step"]
    assert private_imports(modules) == [
        "csd_kernels.decoding.eager:2 reads _helper of csd_kernels.reference.verify",
        "csd_kernels.decoding.step:1 imports _helper from csd_kernels.reference.verify"]
