"""The folder layout is the architecture: data flows one way (ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> top-level modules it must never import
FORBIDDEN = {
    "cast_trtllm": {"runtime", "plugins", "engine_builder", "drafter_builder", "perf", "tensorrt", "tensorrt_llm",
                    "triton", "transformers"},
    "plugins": {"runtime", "engine_builder", "drafter_builder", "perf"},
    "runtime": {"engine_builder", "drafter_builder", "perf"},
}
PACKAGES = ("cast_trtllm", "runtime", "plugins", "engine_builder", "drafter_builder", "perf")
# the one public face of the core that reaches the runtime (lazily: inside functions only)
PUBLIC_FACE = {"cast_trtllm/llmapi.py": {"runtime"}}
MAX_LINES = 300


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_never_imports_downstream_layers(package):
    offenders = {
        rel: sorted(_imports(p) & FORBIDDEN[package] - PUBLIC_FACE.get(rel, set()))
        for p in (ROOT / package).rglob("*.py") if (rel := str(p.relative_to(ROOT)))
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_the_llm_api_face_reaches_the_runtime_only_when_used():
    for rel, allowed in PUBLIC_FACE.items():
        eager = {name.split(".")[0] for name in _module_imports(ROOT / rel)}
        assert not eager & allowed, f"{rel} imports {sorted(eager & allowed)} at module level"


def test_no_source_file_is_over_300_lines():
    long = {str(p.relative_to(ROOT)): n for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these files (one concept per file): {long}"


def _module_imports(path: Path) -> set[str]:
    """Project modules a file imports at module level (function-local imports excluded)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return {n for n in names if n.split(".")[0] in PACKAGES}


def test_no_import_cycle_between_modules():
    graph = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            mod = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            graph[mod] = {m for m in _module_imports(p) if m != mod}
    state: dict[str, int] = {}

    def visit(mod: str, stack: list[str]) -> list[str] | None:
        state[mod] = 1
        for dep in sorted(graph.get(mod, ())):
            if dep not in graph or mod.startswith(dep + "."):
                continue  # outside the project, or the package's own __init__
            if state.get(dep) == 1:
                return stack + [mod, dep]
            if dep not in state and (cycle := visit(dep, stack + [mod])):
                return cycle
        state[mod] = 2
        return None

    for mod in sorted(graph):
        if mod not in state and (cycle := visit(mod, [])):
            pytest.fail(f"import cycle: {' -> '.join(cycle)}")


# inside runtime: folder -> runtime folders it must never import, function-local imports included
# (a lazy import is still a circle: runtime.backends <- runtime.engine, plugins' aot <- triton_kernel)
RUNTIME_FORBIDDEN = {"runtime/backends": {"runtime.engine", "runtime.serving"},
                     "runtime/model": {"runtime.engine", "runtime.serving", "runtime.backends"},
                     "runtime/drafter": {"runtime.engine", "runtime.serving"}}


@pytest.mark.parametrize("folder", sorted(RUNTIME_FORBIDDEN))
def test_runtime_layers_import_one_way_even_lazily(folder):
    def every_import(path: Path) -> set[str]:
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
        return out

    offenders = {str(p.relative_to(ROOT)): sorted(m for m in every_import(p) if any(
        m == f or m.startswith(f + ".") for f in RUNTIME_FORBIDDEN[folder])) for p in (ROOT / folder).rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_triton_kernels_and_their_aot_compiler_import_one_way():
    kernels = (ROOT / "plugins/tree_attention/triton_kernel.py").read_text()
    assert "tree_attention.aot" not in kernels and "from plugins.tree_attention import aot" not in kernels
