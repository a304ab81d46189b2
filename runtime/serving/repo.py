"""Write a Triton model repository for CAST (layout of TensorRT-LLM's Triton backend).

    <out>/
      cast/
        config.pbtxt     Python backend; inputs/outputs of `requests.INPUTS/OUTPUTS`;
                         settings as `parameters`; decoupled streaming optional
        1/model.py       `runtime.serving.model`
"""

from __future__ import annotations

import shutil
from pathlib import Path

import runtime
from runtime.serving.config import ServingConfig
from runtime.serving.requests import INPUTS, OUTPUTS

MODEL_NAME = "cast"
_DIMS = {"text_input": "[ 1 ]", "stop_words": "[ -1 ]", "output_ids": "[ -1 ]", "accept_lengths": "[ -1 ]"}


def config_pbtxt(cfg: ServingConfig, decoupled: bool, project_root: str, name: str = MODEL_NAME) -> str:
    def tensor(tensor_name: str, dtype: str, optional: bool | None) -> str:
        dims = _DIMS.get(tensor_name, "[ 1 ]")
        opt = "" if optional is None else f"\n    optional: {str(optional).lower()}"
        return f'  {{\n    name: "{tensor_name}"\n    data_type: TYPE_{"STRING" if dtype == "BYTES" else dtype}\n    dims: {dims}{opt}\n  }}'

    inputs = ",\n".join(tensor(n, d, not req) for n, (d, _, req) in INPUTS.items())
    outputs = ",\n".join(tensor(n, d, None) for n, d in OUTPUTS.items())
    params = {**cfg.to_params(), "project_root": project_root}
    param_text = "\n".join(
        f'parameters: {{\n  key: "{k}"\n  value: {{ string_value: "{v}" }}\n}}' for k, v in params.items()
    )
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n\n'
        f"model_transaction_policy {{\n  decoupled: {str(decoupled).lower()}\n}}\n\n"
        f"input [\n{inputs}\n]\n\noutput [\n{outputs}\n]\n\n"
        "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n\n"
        f"{param_text}\n"
    )


def write_repo(out: str | Path, cfg: ServingConfig, decoupled: bool = False, name: str = MODEL_NAME) -> Path:
    """Create (or overwrite) model `name` in repository `out`; returns the model dir."""
    model_dir = Path(out) / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    project_root = str(Path(runtime.__file__).resolve().parent.parent)
    (model_dir / "config.pbtxt").write_text(config_pbtxt(cfg, decoupled, project_root, name))
    shutil.copyfile(Path(__file__).with_name("model.py"), model_dir / "1" / "model.py")
    return model_dir
