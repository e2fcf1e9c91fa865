"""The package's import graph: no cycles, and every import of one of its own
modules at the top of the importing module (none inside a function, where
one would only hide a cycle). Read from the source with ``ast``, so a cycle
that Python happens to resolve (because of the order modules load in) still
fails here."""

from __future__ import annotations

import ast
import pathlib

import jaxsparse_rows

ROOT = pathlib.Path(jaxsparse_rows.__file__).parent
PACKAGE = ROOT.name


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _targets(module: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The package modules an import statement in ``module`` loads (``from .
    import x`` loads ``x``, not the package)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in MODULES and a.name != PACKAGE]
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = module.split(".")
        if MODULES[module].name != "__init__.py":
            pkg = pkg[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
    if subs:
        return subs
    return [base] if base in MODULES and base != module else []


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """``{module: modules it imports}`` and the imports made inside functions."""
    graph = {m: set() for m in MODULES}
    local = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = [t for t in _targets(module, node) if t != module]
            graph[module].update(targets)
            if targets and id(node) not in top and not _in_type_checking(tree, node):
                local.append(f"{module} imports {', '.join(targets)} (line {node.lineno})")
    return graph, local


def _in_type_checking(tree: ast.Module, node: ast.AST) -> bool:
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.dump(stmt.test):
            if any(n is node for n in ast.walk(stmt)):
                return True
    return False


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    graph, _ = _graph()
    assert _cycles(graph) == []


def test_no_package_import_inside_a_function():
    _, local = _graph()
    assert local == []


def test_the_graph_reader_finds_cycles_and_local_imports(tmp_path, monkeypatch):
    """The checks can fail: a two-module cycle and an import inside a
    function, written to a scratch package, are both reported."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import g\n\ndef f():\n    return g\n")
    (pkg / "b.py").write_text("def g():\n    from .a import f\n    return f\n")
    modules = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py"}
    monkeypatch.setattr(__import__(__name__), "MODULES", modules)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", "pkg")
    graph, local = _graph()
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]
    assert local == ["pkg.b imports pkg.a (line 2)"]


def test_the_package_imports_and_works_without_the_framework_extras():
    """flax, equinox and orbax are test extras only: with their imports
    blocked, the package imports and ``sparse="auto"`` works."""
    import subprocess
    import sys

    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("flax", "equinox", "orbax"):
            raise ImportError(f"{name} blocked")
sys.meta_path.insert(0, Block())
import jax.numpy as jnp
import jaxsparse_rows as jsr
g = jsr.grad(lambda p: jnp.sum(p["emb"][jnp.array([1, 3])]), sparse="auto")(
    {"emb": jnp.ones((5, 2))}
)
assert isinstance(g["emb"], jsr.RowSparse) and g["emb"].indices.tolist() == [1, 3]
assert not any(m.split(".")[0] in ("flax", "equinox", "orbax") for m in sys.modules)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
