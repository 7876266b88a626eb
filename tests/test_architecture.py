"""The layering written in the README holds: no module imports a higher layer, and no import cycle exists.

Read statically (``ast``), so every import counts: one hidden in a function is still a dependency, and one under
``if TYPE_CHECKING:`` still ties the two modules together (a cycle there means the design has one).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "logbuf"

# Bottom (0) to top, as in the README's architecture sketch.  A module may import its own package and any
# package of a strictly lower rank; packages that share a rank do not import each other.
LAYERS: dict[str, int] = {
    "errors": 0, "_native": 0, "_client": 0,  # compiled modules import nothing of ours
    "native": 1,
    "position": 2, "idle": 2, "cli_args": 2, "directory": 2,
    "logbuffer": 3, "cnc": 3,
    "channel": 4, "protocol": 4,
    "client": 5,
    "driver": 6, "tools": 6,
    "marketdata": 7, "recording": 7,  # marketdata: the MoldUDP64 and ITCH codecs, below both of their users
    "exchange": 8, "feed": 8,  # the exchange simulator and the feed handler: neither imports the other
    "recorder": 9,
    "pipeline": 10,
    "samples": 11,  # the examples (IPC rigs, the top-of-book subscriber): on top of everything they show
    "logbuf": 12,  # the public facade (src/logbuf/__init__.py): re-exports, imported only by applications
    "demo": 13, "cli": 13,
}


COMPILED = {"_native", "_client"}  # extension modules built from native/ (no .py file to read)


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(module: str, name: str | None, known: dict[str, Path]) -> str:
    """``from a.b import c`` names module ``a.b.c`` when that is a module, else ``a.b``."""
    if name and (f"{module}.{name}" in known or name in COMPILED):
        return f"{module}.{name}"
    return module


def _imports(tree: ast.AST, known: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "logbuf")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "logbuf":
            found.update(_resolve(node.module, a.name, known) for a in node.names)
    return found


def _layer_of(module: str) -> tuple[str, int]:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "logbuf"
    assert key in LAYERS, f"{module}: package {key!r} has no layer; add it to LAYERS (and to the README)"
    return key, LAYERS[key]


def test_no_module_imports_a_higher_layer() -> None:
    known = _modules()
    violations = []
    for module, path in sorted(known.items()):
        source_key, source_rank = _layer_of(module)
        for target in sorted(_imports(ast.parse(path.read_text()), known)):
            target_key, target_rank = _layer_of(target)
            if target_key != source_key and target_rank >= source_rank:
                violations.append(f"{module} (layer {source_rank}) imports {target} (layer {target_rank})")
    assert not violations, "layering violations:\n" + "\n".join(violations)


def test_no_import_cycles() -> None:
    known = _modules()
    graph = {
        module: {t for t in _imports(ast.parse(path.read_text()), known) if t in known}
        for module, path in known.items()
    }
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
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
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_market_data_layering() -> None:
    """The codecs sit below both of their users; the exchange simulator and the feed handler share a rank, so
    neither imports the other (the handler is tested against the simulator, never built from it); the examples
    sit on top."""
    assert LAYERS["marketdata"] < LAYERS["exchange"] == LAYERS["feed"] < LAYERS["samples"]


def test_every_package_has_a_layer() -> None:
    for module in _modules():
        _layer_of(module)
