"""ONNX export of the verify, draft and drafter-context graphs (torch TorchScript exporter).

One verify graph serves every width bucket: the packed length n is a dynamic axis and the
bitmask has W = ceil(largest bucket / 32) words (padding words are ignored by both
flavours), so a bucket is an optimization profile (min/opt/max shapes), not another copy
of the weights. `optimization_profiles` writes those records for the build manifest.

    export_verify(target, "verify.onnx", flavour="onnx", mask_words=4)

The graphs and their exporters live in `runtime.model.graphs` / `runtime.model.draft_graphs`
(the runtime's onnxruntime backends export the same graphs); this module adds the manifest records.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import torch

from runtime.drafter.model import DFlashDrafter
from runtime.model.draft_graphs import (CONTEXT_OUTPUTS, ContextGraph, DraftGraph, export_context_graph,
                                        export_draft_graph)
from runtime.model.graphs import OPSET, Flavour, VerifyGraph, export_verify_graph
from runtime.model.layers import Rotary
from runtime.model.llama import LlamaTarget


def mask_words(max_packed: int) -> int:
    """W: int32 words per bitmask row for packs of up to `max_packed` (>= 1: a SKU's largest bucket) tokens."""
    return -(-max_packed // 32)


def truncate_target(target: LlamaTarget, num_layers: int) -> LlamaTarget:
    """The first `num_layers` layers of `target` (weights shared) with its norm and lm_head:
    a cheap stand-in for export tests. Its logits are NOT the full model's."""
    cfg = target.config
    small_cfg = dataclasses.replace(cfg, num_layers=num_layers)
    with torch.device("meta"):
        small = LlamaTarget(small_cfg, Rotary(torch.empty(cfg.head_dim // 2)))
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("layers.") or int(k.split(".")[1]) < num_layers}
    small.load_state_dict(state, strict=True, assign=True)
    small.lm_head.weight = target.lm_head.weight  # keep tied embeddings tied
    small.rotary = target.rotary
    return small.eval().requires_grad_(False)


def export_verify(target: LlamaTarget, path: str | Path, flavour: Flavour, mask_words: int,
                  tap_layer_ids: Sequence[int] = (), example_prefix: int = 5) -> dict[str, Any]:
    """Write the verify graph (layer-major K/V); returns its manifest record (file, inputs, outputs)."""
    cfg, path = target.config, Path(path)
    graph = VerifyGraph(target, flavour, tap_layer_ids)
    export_verify_graph(graph, path, mask_words, example_prefix)
    kv = [cfg.num_layers, "past", cfg.num_kv_heads, cfg.head_dim]
    dtype = _name(target.lm_head.weight.dtype)
    return _record(path, flavour=flavour, inputs={
        "input_ids": (["n"], "int64"), "position_ids": (["n"], "int64"), "bitmask": (["n", mask_words], "int32"),
        "past_keys": (kv, dtype), "past_values": (kv, dtype),
    }, outputs=list(graph.output_names), tap_layer_ids=list(tap_layer_ids))


def export_draft(drafter: DFlashDrafter, target: LlamaTarget, path: str | Path, example_context: int = 5) -> dict:
    """Write the DFlash one-pass block graph (the draft engine, layer-major context K/V)."""
    cfg, path, dtype = drafter.config, Path(path), target.lm_head.weight.dtype
    export_draft_graph(DraftGraph(drafter, target), path, example_context)
    kv = [cfg.num_hidden_layers, "context", cfg.num_key_value_heads, cfg.head_dim]
    return _record(path, inputs={
        "block_ids": ([cfg.block_size], "int64"), "position_ids": ([cfg.block_size], "int64"),
        "context_keys": (kv, _name(dtype)), "context_values": (kv, _name(dtype)),
    }, outputs=["logits"], block_size=cfg.block_size, mask_token_id=cfg.mask_token_id)


def export_context(drafter: DFlashDrafter, path: str | Path) -> dict:
    """Write the feature-cache append graph: target taps -> drafter context K/V (layer-major)."""
    cfg, path = drafter.config, Path(path)
    dtype, width = drafter.fc.weight.dtype, drafter.fc.weight.shape[1]
    export_context_graph(ContextGraph(drafter), path)
    return _record(path, inputs={"taps": (["m", width], _name(dtype)), "position_ids": (["m"], "int64")},
                   outputs=list(CONTEXT_OUTPUTS), target_layer_ids=list(cfg.target_layer_ids))


def optimization_profiles(packed_buckets: Sequence[int], mask_words: int, prefix_opt: int,
                          prefix_max: int) -> list[dict[str, Any]]:
    """One min/opt/max shape record per width bucket for the verify graph's dynamic inputs.

    Bucket b serves packs of (previous bucket, b] tokens (the runtime pads a tree to the
    smallest bucket >= n), tuned at n = b; the KV prefix ranges over [1, prefix_max] (1 <= prefix_opt <= prefix_max).
    """
    profiles, low = [], 1
    for bucket in packed_buckets:
        if bucket > 32 * mask_words:
            raise ValueError(f"bucket {bucket} does not fit a bitmask of {mask_words} words")
        n = {"min": low, "opt": bucket, "max": bucket}
        p = {"min": 1, "opt": prefix_opt, "max": prefix_max}
        profiles.append({"bucket": bucket, "n": n, "past": p})
        low = bucket + 1
    return profiles


def profile_shapes(profile: dict[str, Any], inputs: dict[str, dict]) -> dict[str, dict[str, list[int]]]:
    """Concrete min/opt/max shapes per input: symbolic dims ("n", "past") from the profile."""
    return {name: {key: [profile[d][key] if isinstance(d, str) else d for d in spec["shape"]]
                   for key in ("min", "opt", "max")}
            for name, spec in inputs.items() if any(isinstance(d, str) for d in spec["shape"])}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _record(path: Path, inputs: dict[str, tuple[list, str]], outputs: list[str], **extra) -> dict[str, Any]:
    return {"file": path.name, "bytes": path.stat().st_size, "opset": OPSET,
            "inputs": {k: {"shape": shape, "dtype": dt} for k, (shape, dt) in inputs.items()},
            "outputs": outputs, **extra}
