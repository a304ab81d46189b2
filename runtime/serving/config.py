"""Serving configuration: which engine to build and the server's limits.

Stored as `parameters` (string values) in the model's `config.pbtxt`, the way
TensorRT-LLM's Triton backend carries its settings, and read back by `model.py`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from runtime.batch_decoder import POLICIES

MODELS = ("embedded", "random")


@dataclass(frozen=True, slots=True)
class ServingConfig:
    # engine
    model: str = "embedded"  # "embedded" (SmolLM2-135M) or "random" (tiny seeded test model)
    drafter_dir: str = ""  # DFlash checkpoint dir; "" = the shipped head (embedded) or a random one
    block_size: int = 16  # random drafter only: L + 1
    policy: str = "best_first"  # batch policy for requests whose budget is "auto"
    mean_budget: int = 4  # best_first: shared budget M = mean_budget * B (no profile)
    max_width: int = 32  # best_first: most nodes one request may take from M
    fixed_width: int = 48  # fixed policy: N per request
    uniform_width: int = 8  # uniform policy: W per request
    rank_cap: int = 8  # K: tokens kept per drafted position
    profile: str = ""  # width-profile JSON: best_first takes M from Proposition 3
    seed: int = 0  # random model/drafter weights
    chat: bool = True  # embedded: wrap the prompt in the chat template
    # server limits
    max_batch: int = 8  # most requests decoded together (one round = one verify pass)
    max_queue: int = 64  # requests waiting for a batch slot; beyond it: overload error
    max_tokens_limit: int = 512  # largest max_tokens a request may ask for
    default_max_tokens: int = 64
    max_budget: int = 64  # largest fixed per-request budget a request may ask for
    request_timeout_s: float = 120.0  # from arrival to the last token
    shutdown_grace_s: float = 10.0  # in-flight requests get this long to finish on shutdown

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        positive = ("block_size", "rank_cap", "max_batch", "max_queue", "max_tokens_limit", "default_max_tokens")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError("default_max_tokens must not exceed max_tokens_limit")
        if self.request_timeout_s <= 0 or self.shutdown_grace_s < 0:
            raise ValueError("request_timeout_s must be > 0 and shutdown_grace_s >= 0")

    def to_params(self) -> dict[str, str]:
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in asdict(self).items()}

    @staticmethod
    def from_params(params: dict[str, Any]) -> "ServingConfig":
        """From config.pbtxt parameters ({key: "value"} or Triton's {key: {"string_value": …}})."""
        types = {f.name: f.type for f in fields(ServingConfig)}
        values = {}
        for key, raw in params.items():
            if key not in types:
                continue
            text = raw["string_value"] if isinstance(raw, dict) else str(raw)
            kind = types[key]
            try:
                if kind == "bool":
                    values[key] = text.strip().lower() in ("1", "true", "yes")
                elif kind == "int":
                    values[key] = int(text)
                elif kind == "float":
                    values[key] = float(text)
                else:
                    values[key] = text
            except ValueError as err:
                raise ValueError(f"config.pbtxt parameter {key}={text!r} is not a valid {kind}") from err
        return ServingConfig(**values)
