"""The serving engine a `ServingConfig` names: the one `LLMEngine`, its tokenizer and
prompt encoder (`runtime.engine.build.build_engine` loads the models)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from runtime.engine import LLMEngine
from runtime.serving.config import ServingConfig


@dataclass(frozen=True, slots=True)
class ServingEngine:
    engine: LLMEngine
    tokenizer: Any
    encode: Callable[[str], list[int]]
    model_name: str


def build_engine(cfg: ServingConfig) -> ServingEngine:
    from runtime.engine.build import build_engine as build

    built = build(cfg.target, cfg.drafter, cfg.spec, cfg.device, None if cfg.dtype == "auto" else cfg.dtype,
                  cfg.threads or None, engine_dir=cfg.engine_dir or None)
    return ServingEngine(built.engine, built.models.tokenizer, lambda text: built.encode(text, cfg.chat),
                         built.models.name)
