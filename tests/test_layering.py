"""The folder layout is the architecture: data flows one way (ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> top-level modules it must never import
FORBIDDEN = {
    "cast_trtllm": {"runtime", "plugins", "engine_builder", "perf", "tensorrt", "tensorrt_llm", "triton", "transformers"},
    "plugins": {"runtime", "engine_builder", "perf"},
    "runtime": {"engine_builder", "perf"},
}


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
        str(p.relative_to(ROOT)): sorted(_imports(p) & FORBIDDEN[package])
        for p in (ROOT / package).rglob("*.py")
    }
    assert not {k: v for k, v in offenders.items() if v}
