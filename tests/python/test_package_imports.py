"""The Python package's import graph has no cycles, counting imports inside functions too (they
hide cycles that only show when the function first runs), and the stages import forward only:
graph/, transform/ and the backends import no tracker."""
import ast
import collections
import pathlib

import kiln

PACKAGE = pathlib.Path(kiln.__file__).parent


def _modules():
    mods = {"kiln._C": None}  # the extension: a leaf
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        if "v1" in rel.parts:  # generated gRPC messages
            continue
        name = ".".join(rel.parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods):
    """module -> the kiln modules it imports anywhere in its body."""
    edges = collections.defaultdict(set)
    for name, path in mods.items():
        if path is None:
            continue
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def _cycles(edges):
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycles():
    mods = _modules()
    assert "kiln.variables.base" in mods and "kiln.eval_frame" in mods
    assert _cycles(_imports(mods)) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_graph_transform_and_backends_import_no_trackers():
    edges = _imports(_modules())
    for name, targets in edges.items():
        if name.startswith(("kiln.graph", "kiln.transform", "kiln.backends")):
            trackers = sorted(t for t in targets if t.startswith("kiln.variables"))
            assert trackers == [], f"{name} imports {trackers}"


def test_the_executor_gets_kilns_python_side_from_its_host_only():
    source = (PACKAGE.parents[1] / "capture" / "executor.cpp").read_text()
    assert "py::module_::import(\"kiln" not in source and "import(\"kiln" not in source
    assert "py::hasattr(" not in source.replace("py::hasattr(opcode", "")
