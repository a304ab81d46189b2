"""Serving configuration: which models and speculative settings, and the server's limits.

The speculative settings are the one `cast_trtllm.spec_config.SpecConfig`; the models
are what `runtime.loader` accepts (`target`: embedded | HF dir | .gguf; `drafter`:
default | dir | none). Stored as string `parameters` in the model's `config.pbtxt`, the
way TensorRT-LLM's Triton backend carries its settings (spec fields as `spec_<name>`),
and read back by `model.py`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from cast_trtllm.spec_config import SpecConfig, check_budget

SPEC_PREFIX = "spec_"


@dataclass(frozen=True, slots=True)
class ServingConfig:
    # models (runtime.loader)
    target: str = "embedded"
    drafter: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 0  # torch CPU threads; 0 = torch's choice
    engine_dir: str = ""  # a built engine directory to run (`--engine`); "" = export on first use
    chat: bool = True  # wrap text_input in the tokenizer's chat template
    spec: SpecConfig = field(default_factory=SpecConfig)
    # server limits
    max_batch: int = 8  # most requests decoded together (one round = one verify pass)
    max_num_tokens: int = 512  # tokens per round's target pass (decode packs, then prompt chunks)
    max_queue: int = 64  # requests waiting for a batch slot; beyond it: overload error
    max_tokens_limit: int = 512  # largest max_tokens a request may ask for
    default_max_tokens: int = 64
    request_timeout_s: float = 120.0  # from arrival to the last token
    shutdown_grace_s: float = 10.0  # in-flight requests get this long to finish on shutdown

    def __post_init__(self) -> None:
        positive = ("max_batch", "max_num_tokens", "max_queue", "max_tokens_limit", "default_max_tokens")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError("default_max_tokens must not exceed max_tokens_limit")
        if self.request_timeout_s <= 0 or self.shutdown_grace_s < 0:
            raise ValueError("request_timeout_s must be > 0 and shutdown_grace_s >= 0")

    def to_params(self) -> dict[str, str]:
        flat = {k: v for k, v in asdict(self).items() if k != "spec"}
        flat.update({SPEC_PREFIX + k: v for k, v in asdict(self.spec).items() if v is not None})
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in flat.items()}

    @staticmethod
    def from_params(params: dict[str, Any]) -> "ServingConfig":
        """From config.pbtxt parameters ({key: "value"} or Triton's {key: {"string_value": …}})."""
        own = {f.name: f.type for f in fields(ServingConfig) if f.name != "spec"}
        spec_types = {f.name: f.type for f in fields(SpecConfig)}
        values, spec = {}, {}
        for key, raw in params.items():
            text = raw["string_value"] if isinstance(raw, dict) else str(raw)
            name = key.removeprefix(SPEC_PREFIX)
            if key.startswith(SPEC_PREFIX) and name in spec_types:
                spec[name] = _parse(key, text, spec_types[name])
            elif key in own:
                values[key] = _parse(key, text, own[key])
        return ServingConfig(**values, spec=SpecConfig(**spec))

    def build(self):
        """The engine this config names: `runtime.engine.build.Built` (engine, models, `encode`)."""
        from runtime.engine.build import build_engine

        return build_engine(self.target, self.drafter, self.spec, self.device,
                            None if self.dtype == "auto" else self.dtype, self.threads or None,
                            engine_dir=self.engine_dir or None, max_num_tokens=self.max_num_tokens)


def _parse(key: str, text: str, kind: str) -> Any:
    try:
        if kind == "bool":
            return text.strip().lower() in ("1", "true", "yes")
        if kind == "int" or kind == "int | None":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "int | str":  # budget
            return check_budget(text.strip())
        return text
    except ValueError as err:
        raise ValueError(f"config.pbtxt parameter {key}={text!r} is not a valid {kind}") from err
