"""LLM-API fixtures: `LLM` objects over the session's embedded checkpoint (read once), fp32
(no first-use probe), the execution cache in a temporary folder."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def make_llm(embedded_checkpoint, tmp_path_factory):
    import runtime.loader
    from runtime.loader import models_from_hf

    from cast_trtllm import LLM

    made = []
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAST_CACHE_DIR", str(tmp_path_factory.mktemp("cast-cache")))
        mp.setattr(runtime.loader, "load_models",
                   lambda target, drafter, device, dtype: models_from_hf(embedded_checkpoint, drafter))

        def make(**kwargs):
            llm = LLM(model="embedded", dtype="float32", threads=threads, **kwargs)
            made.append(llm)
            return llm

        yield make
    for llm in made:
        llm.shutdown()
