"""The README's build -> `generate --engine` line runs as written, on the default path (the
embedded target, the shipped drafter, the CPU SKU without TensorRT), through the installed
`cast-trtllm` console script of this interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.tree_attention.trt_plugin import tensorrt_status

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("onnxruntime")


def _readme_line() -> str:
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("cast-trtllm build --sku cpu") and "generate --engine" in line:
            return line.split("#")[0].strip()
    raise AssertionError("the README has no `cast-trtllm build --sku cpu ... && cast-trtllm generate --engine` line")


@pytest.mark.slow  # about 2 minutes on 2 cores: it exports the embedded model's graphs (1.8 GB) and reloads them
@pytest.mark.skipif(tensorrt_status() is None, reason="TensorRT is importable here: the build would build engines")
def test_the_readme_build_then_generate_engine_line_works_as_written(tmp_path):
    script = Path(sys.executable).parent / "cast-trtllm"
    if not script.exists():
        pytest.skip(f"no cast-trtllm console script beside {sys.executable}")
    env = {**os.environ, "PATH": f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "CAST_CACHE_DIR": str(tmp_path / "cache"), "TQDM_DISABLE": "1"}
    try:
        ran = subprocess.run(["bash", "-c", _readme_line()], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=900)
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
        assert "the TensorRT step is for GPU SKUs" in ran.stdout + ran.stderr
        assert "engine directory eng/" in ran.stderr and "method" in ran.stdout and "tokens/s" in ran.stdout
    finally:
        shutil.rmtree(tmp_path / "eng", ignore_errors=True)  # 1.8 GB of graphs
