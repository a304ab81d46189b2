"""Write a Triton model repository that answers TensorRT-LLM-backend clients as they are.

    <out>/
      ensemble/
        config.pbtxt     Python backend with the inputs/outputs of TensorRT-LLM's
                         `inflight_batcher_llm/ensemble` (`requests.INPUTS/OUTPUTS`), the
                         serving settings as `parameters`, decoupled mode optional
                         (TensorRT-LLM's `decoupled_mode`), `instance_group` scale-out
        1/model.py       `runtime.serving.model` (it imports the rest from the project root)

One model does what TensorRT-LLM's preprocessing → tensorrt_llm → postprocessing
ensemble does (tokenize, decode, detokenize), so it carries the name clients send to:
`ensemble`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import runtime
from runtime.serving.config import ServingConfig
from runtime.serving.requests import INPUTS, OUTPUTS, TensorSpec

MODEL_NAME = "ensemble"
KINDS = ("cpu", "gpu")


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """Triton `instance_group`: `count` model instances (each its own engine, scheduler and
    caches) per listed GPU (`kind` gpu; `gpus` () = every visible GPU), or `count` on the CPU."""

    count: int = 1
    kind: str = "cpu"
    gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(int(g) for g in self.gpus))
        if self.count < 1:
            raise ValueError(f"instances must be >= 1, got {self.count}")
        if self.kind not in KINDS:
            raise ValueError(f"instance kind must be one of {KINDS}, got {self.kind!r}")
        if self.gpus and self.kind != "gpu":
            raise ValueError("a GPU list needs instance kind 'gpu'")
        if any(g < 0 for g in self.gpus) or len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"GPU ids must be distinct integers >= 0, got {list(self.gpus)}")

    def pbtxt(self) -> str:
        gpus = f"\n    gpus: [ {', '.join(map(str, self.gpus))} ]" if self.gpus else ""
        return f"instance_group [\n  {{\n    count: {self.count}\n    kind: KIND_{self.kind.upper()}{gpus}\n  }}\n]"


def _tensor(spec: TensorSpec, is_input: bool) -> str:
    lines = [f'    name: "{spec.name}"', f"    data_type: TYPE_{spec.dtype}",
             f"    dims: [ {', '.join(map(str, spec.dims))} ]"]
    if is_input and spec.optional:
        lines.append("    optional: true")
    if spec.ragged:
        lines.append("    allow_ragged_batch: true")
    return "  {\n" + "\n".join(lines) + "\n  }"


def config_pbtxt(cfg: ServingConfig, decoupled: bool, project_root: str, name: str = MODEL_NAME,
                 instances: InstanceGroup = InstanceGroup()) -> str:
    inputs = ",\n".join(_tensor(s, True) for s in INPUTS)
    outputs = ",\n".join(_tensor(s, False) for s in OUTPUTS)
    params = {**cfg.to_params(), "project_root": project_root}
    param_text = "\n".join(
        f'parameters: {{\n  key: "{k}"\n  value: {{ string_value: "{v}" }}\n}}' for k, v in params.items()
    )
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {cfg.max_batch}\n\n'
        f"model_transaction_policy {{\n  decoupled: {str(decoupled).lower()}\n}}\n\n"
        f"input [\n{inputs}\n]\n\noutput [\n{outputs}\n]\n\n{instances.pbtxt()}\n\n{param_text}\n"
    )


def write_repo(out: str | Path, cfg: ServingConfig, decoupled: bool = False, name: str = MODEL_NAME,
               instances: InstanceGroup = InstanceGroup()) -> Path:
    """Create (or overwrite) model `name` in repository `out`; returns the model dir."""
    model_dir = Path(out) / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    project_root = str(Path(runtime.__file__).resolve().parent.parent)
    (model_dir / "config.pbtxt").write_text(config_pbtxt(cfg, decoupled, project_root, name, instances))
    shutil.copyfile(Path(__file__).with_name("model.py"), model_dir / "1" / "model.py")
    return model_dir
