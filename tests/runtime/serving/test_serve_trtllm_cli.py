"""`cast-trtllm serve MODEL` with trtllm-serve's command line: a TensorRT-LLM 1.4 DFlash YAML
(every field, top-level keys too) through `--extra_llm_api_options`, `--max_batch_size`,
and the official `openai` client's chat request with trtllm-serve's extra body fields."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

openai = pytest.importorskip("openai")

from runtime.drafter import DEFAULT_DRAFTER  # noqa: E402
from runtime.serving.openai.app import render_chat  # noqa: E402
from tests.cast_trtllm.test_llm_api_options import DFLASH_14_FIELDS  # noqa: E402
from tests.runtime.serving.openai_server import free_port  # noqa: E402
from tests.runtime.serving.tiny_model import tiny_dirs  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SERVE = "from cast_trtllm.cli import main; main()"  # `cast-trtllm` with this interpreter


def _dflash14(tmp_path: Path) -> Path:
    """Every 1.4 DFlashDecodingConfig field, aimed at the shipped head, plus top-level engine keys."""
    head = json.loads((Path(DEFAULT_DRAFTER) / "config.json").read_text())["dflash_config"]
    block = {**DFLASH_14_FIELDS, "speculative_model": str(DEFAULT_DRAFTER), "mask_token_id": head["mask_token_id"],
             "target_layer_ids": head["target_layer_ids"]}
    path = tmp_path / "dflash14.yaml"
    path.write_text(yaml.safe_dump({"speculative_config": block, "max_num_tokens": 256,
                                    "kv_cache_config": {"free_gpu_memory_fraction": 0.9}}))
    return path


@pytest.mark.slow  # the embedded model loads in the server process (~30 s)
def test_serve_model_with_trtllm_serve_flags_answers_the_openai_clients_chat_with_extra_body(tmp_path):
    port = free_port()
    args = ["serve", "embedded", "--extra_llm_api_options", str(_dflash14(tmp_path)), "--max_batch_size", "8",
            "--backend", "pytorch", "--port", str(port), "--dtype", "float32"]
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, *args], cwd=ROOT, stderr=err,
                                env={**__import__("os").environ, "CAST_CACHE_DIR": str(tmp_path / "cache")})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health").status_code == 200:
                    break
            time.sleep(0.5)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0,
            stop=["4"], extra_body={"chat_template_kwargs": {"enable_thinking": False},
                                    "include_stop_str_in_output": True, "repetition_penalty": 1.0, "min_p": 0.0,
                                    "skip_special_tokens": True, "spaces_between_special_tokens": True})
        choice = reply.model_dump()["choices"][0]
        assert choice["message"]["content"] and choice["avg_decoded_tokens_per_iter"] >= 1.0
        if choice["finish_reason"] == "stop" and "4" in choice["message"]["content"]:
            assert choice["message"]["content"].endswith("4")  # the stop string kept, as asked
        assert httpx.get(url + "/version").json()["version"]
    finally:
        proc.terminate()
        proc.wait(60)
    notes = log.read_text()
    for field in ("moe_backend", "spec_dec_variant", "context_recompute_tail", "skip_ctx_buffer_budget_check",
                  "attention_backend", "kv_cache_config", "backend"):
        assert f"{field}" in notes and "ignored" in notes, field
    assert "max_num_tokens 256 -> tokens per round" in notes


def test_chat_template_kwargs_reach_the_template():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs()[0])
    tokenizer.chat_template = ("{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}"
                               "{{ messages[0]['content'] }}")
    messages = [{"role": "user", "content": "hi"}]
    assert render_chat(tokenizer, messages, {"enable_thinking": False}) == "/no_think hi"
    assert render_chat(tokenizer, messages) == "hi"


def test_a_model_given_twice_and_parallelism_are_refused(tmp_path):
    from click.testing import CliRunner

    from cast_trtllm.cli import main

    twice = CliRunner().invoke(main, ["serve", "embedded", "--target", "embedded"])
    assert twice.exit_code == 2 and "give the model once" in twice.output
    tp = CliRunner().invoke(main, ["serve", "embedded", "--tp_size", "2"])
    assert tp.exit_code == 2 and "--tp_size 2 is not supported" in tp.output
