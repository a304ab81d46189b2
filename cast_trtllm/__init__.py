"""cast-trtllm: Cost-Aware Speculative Trees for DFlash block drafters.

This package is the engine-independent core: trees (`tree`, searched by `best_first`),
masks (`masks`), acceptance rules (`verify`, `sampling`, lossy `relaxed`), and the width:
the measured cost curve (`cost_curve`), width profiles (`profile`), the width rules and
the profile policy (`width`), the online-learned cost table (`cost_model`)
and the draft gate (`draft_gate`). It imports only numpy and torch; it never touches an
engine or a GPU. The LLM API's names (`LLM`, `SamplingParams`, ...) are re-exported from
`cast_trtllm.llmapi` on first use, so `import cast_trtllm` stays free of engines.
"""

from typing import Any

__version__ = "0.1.0"
_LLMAPI = ("LLM", "SamplingParams", "DFlashDecodingConfig", "CASTDecodingConfig", "RequestOutput",
           "CompletionOutput")


def __getattr__(name: str) -> Any:
    if name in _LLMAPI:
        from cast_trtllm import llmapi

        return getattr(llmapi, name)
    raise AttributeError(f"module 'cast_trtllm' has no attribute {name!r}")
