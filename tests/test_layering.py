"""The layering rule of DESIGN.md ("Layers"), read from every import in memest/ (lazy ones too).

errors/spec/devices/result <- workload <- sources <- estimate <- planning, trace, calibration
<- report <- api <- cli: a module may import its own layer and the layers below, never above; and
no two modules may import each other in a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "memest"

# The first matching prefix decides a module's layer.
LAYERS: tuple[tuple[str, int], ...] = (
    ("memest.errors", 1),
    ("memest.memo", 1),
    ("memest.spec", 1),
    ("memest.devices", 1),
    ("memest.result", 1),
    ("memest.lora_targets", 1),
    ("memest.dtypes", 1),
    ("memest.workload", 2),
    ("memest.sources", 3),
    ("memest.logs", 3),
    ("memest.estimate", 4),
    ("memest.planning", 5),
    ("memest.trace", 5),
    ("memest.calibration", 5),
    ("memest.check", 5),
    ("memest.report", 6),
    ("memest.validation", 6),
    ("memest.api", 7),
    ("memest.cli", 8),
    ("memest.web", 8),
    ("memest.integrations", 8),
    ("memest.__main__", 8),
)


def layer_of(module: str) -> int | None:
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def memest_imports(path: Path) -> set[str]:
    """Every memest module ``path`` imports, at any depth of the file (lazy imports included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("memest")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("memest"):
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                as_path = PACKAGE.parent / sub.replace(".", "/")
                found.add(sub if as_path.with_suffix(".py").exists() or as_path.is_dir() else mod)
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if m != "memest" and layer_of(m) is None)
    assert not unplaced, f"modules outside every layer of DESIGN.md: {unplaced}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "memest"))
def test_imports_only_layers_below(module):
    own = layer_of(module)
    upward = sorted(
        f"{dep} (layer {layer_of(dep)})"
        for dep in memest_imports(MODULES[module])
        if dep != "memest" and layer_of(dep) is not None and own is not None and layer_of(dep) > own
    )
    assert not upward, f"{module} (layer {own}) imports a higher layer: {upward}"


def test_no_import_cycles():
    graph = {m: {d if d in MODULES else d.rsplit(".", 1)[0] for d in memest_imports(p)} - {m, "memest"}
             for m, p in MODULES.items() if m != "memest"}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in graph.get(node, ()):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
