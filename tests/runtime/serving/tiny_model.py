"""The tiny real checkpoint the Triton tests serve: a random Llama-3-shaped HF checkpoint with
a real byte-level tokenizer and a z-lab-format DFlash drafter (`tests.runtime.hf_checkpoints`),
written once per test process. A server loads it by path like any HF model directory."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from cast_trtllm.spec_config import SpecConfig
from runtime.serving.config import ServingConfig

SPEC = SpecConfig(budget=6)  # a fixed budget: the tiny model has no measured width profile for `auto`


@functools.cache
def tiny_dirs() -> tuple[str, str]:
    """(target dir, drafter dir), written on first use and removed at exit."""
    from tests.runtime.hf_checkpoints import write_tiny_checkpoint, write_tiny_drafter

    root = Path(tempfile.mkdtemp(prefix="cast-tiny-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    target = write_tiny_checkpoint("llama", root / "llama")
    return str(target), str(write_tiny_drafter(target, root / "dflash"))


def tiny_config(**limits) -> ServingConfig:
    """A ServingConfig serving the tiny checkpoint in fp32 on one CPU thread, with `limits` set.

    dtype and threads are pinned (not measured per process): a server and the test process
    must run the same arithmetic for greedy outputs to be compared token for token."""
    target, drafter = tiny_dirs()
    return ServingConfig(target=target, drafter=drafter, device="cpu", dtype="float32", threads=1, spec=SPEC, **limits)
