"""The `ensemble` interface without a server: TensorRT-LLM's input/output names, types and
dims, request validation (honoured, neutral-only and refused inputs), the metrics and
text pieces a response reports, and the repository's config.pbtxt."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from runtime.loader import encode_prompt
from runtime.serving.config import ServingConfig
from runtime.serving.outputs import TextStream, response_arrays, spec_stats
from runtime.serving.repo import InstanceGroup, config_pbtxt
from runtime.serving.requests import INPUTS, OUTPUTS, parse_request, split_batch
from tests.runtime.hf_checkpoints import VOCAB, tiny_tokenizer

CFG = ServingConfig(max_tokens_limit=16, default_max_tokens=4)
# TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt: name -> (type, dims)
UPSTREAM_INPUTS = {
    "text_input": ("STRING", (1,)), "decoder_text_input": ("STRING", (1,)), "max_tokens": ("INT32", (1,)),
    "num_return_sequences": ("INT32", (1,)), "bad_words": ("STRING", (-1,)), "stop_words": ("STRING", (-1,)),
    "exclude_input_in_output": ("BOOL", (1,)), "end_id": ("INT32", (1,)), "pad_id": ("INT32", (1,)),
    "top_k": ("INT32", (1,)), "top_p": ("FP32", (1,)), "temperature": ("FP32", (1,)),
    "length_penalty": ("FP32", (1,)), "repetition_penalty": ("FP32", (1,)), "min_tokens": ("INT32", (1,)),
    "presence_penalty": ("FP32", (1,)), "frequency_penalty": ("FP32", (1,)), "seed": ("UINT64", (1,)),
    "return_log_probs": ("BOOL", (1,)), "return_context_logits": ("BOOL", (1,)),
    "return_generation_logits": ("BOOL", (1,)), "return_perf_metrics": ("BOOL", (1,)),
    "return_num_input_tokens": ("BOOL", (1,)), "return_num_output_tokens": ("BOOL", (1,)),
    "beam_width": ("INT32", (1,)), "stream": ("BOOL", (1,)), "prompt_embedding_table": ("FP16", (-1, -1)),
    "prompt_table_extra_id": ("UINT64", (1,)), "prompt_vocab_size": ("INT32", (1,)),
    "embedding_bias_words": ("STRING", (-1,)), "embedding_bias_weights": ("FP32", (-1,)),
    "lora_task_id": ("UINT64", (1,)), "lora_weights": ("FP16", (-1, -1)), "lora_config": ("INT32", (-1, 3)),
    "guided_decoding_guide_type": ("STRING", (1,)), "guided_decoding_guide": ("STRING", (1,)),
}
UPSTREAM_OUTPUTS = {"text_output": ("STRING", (-1,)), "acceptance_rate": ("FP32", (1,)),
                    "total_accepted_draft_tokens": ("INT32", (1,)), "total_draft_tokens": ("INT32", (1,)),
                    "num_input_tokens": ("INT32", (1,)), "num_output_tokens": ("INT32", (1,)),
                    "arrival_time_ns": ("INT64", (1,)), "first_token_time_ns": ("INT64", (1,)),
                    "last_token_time_ns": ("INT64", (1,))}


def parse(**inputs):
    tok = tiny_tokenizer()
    return parse_request("r", inputs, CFG, lambda text: encode_prompt(tok, text, chat=False), 64, VOCAB, tok)


def s(*texts: str) -> np.ndarray:
    return np.array([t.encode() for t in texts], dtype=np.object_)


def i32(v) -> np.ndarray:
    return np.array([v], np.int32)


HELLO = s("hello")


def test_inputs_and_outputs_carry_tensorrt_llm_ensemble_names_types_and_dims():
    ours = {t.name: (t.dtype, t.dims) for t in INPUTS}
    assert {k: ours[k] for k in UPSTREAM_INPUTS} == UPSTREAM_INPUTS
    assert set(ours) - set(UPSTREAM_INPUTS) == {"method", "budget"}
    assert [t.name for t in INPUTS if not t.optional] == ["text_input"]
    outs = {t.name: (t.dtype, t.dims) for t in OUTPUTS}
    assert {k: outs[k] for k in UPSTREAM_OUTPUTS} == UPSTREAM_OUTPUTS


@pytest.mark.parametrize("inputs, message", [
    (dict(max_tokens=i32(4)), "missing required input 'text_input'"),
    (dict(text_input=np.array([1.0], np.float32)), "'text_input' must be TYPE_STRING"),
    (dict(text_input=HELLO, max_tokens=np.array([4.0], np.float32)), "'max_tokens' must be TYPE_INT32"),
    (dict(text_input=s("  ")), "'text_input' is empty"),
    (dict(text_input=HELLO, max_tokens=i32(17)), r"max_tokens=17 is out of range: must be in \[1, 16\]"),
    (dict(text_input=s("x" * 60), max_tokens=i32(16)), "exceeds the context window of 64 tokens"),
    (dict(text_input=HELLO, temperature=np.array([-1.0], np.float32)), "temperature must be"),
    (dict(text_input=HELLO, top_p=np.array([1.5], np.float32)), "top_p must be a number in"),
    (dict(text_input=HELLO, top_k=i32(-2)), "top_k must be"),
    (dict(text_input=HELLO, budget=s("lots")), "input 'budget' must be 'auto' or an integer"),
    (dict(text_input=HELLO, method=s("beam")), "method must be one of"),
    (dict(text_input=HELLO, end_id=i32(VOCAB)), f"input 'end_id'={VOCAB} is not a token id"),
    (dict(text_input=HELLO, pad_id=i32(-1)), "input 'pad_id'=-1 is not a token id"),
    (dict(text_input=HELLO, beam_width=i32(2)), "input 'beam_width'=2 is not supported: beam search"),
    (dict(text_input=HELLO, num_return_sequences=i32(3)), "'num_return_sequences'=3 is not supported"),
    (dict(text_input=HELLO, min_tokens=i32(-1)), "min_tokens must be an integer >= 0, got -1"),
    (dict(text_input=HELLO, repetition_penalty=np.array([0.0], np.float32)), "repetition_penalty must be a number > 0"),
    (dict(text_input=HELLO, return_log_probs=np.array([True])), "'return_log_probs'=True is not supported"),
    (dict(text_input=HELLO, decoder_text_input=s("x")), "encoder-decoder models"),
    (dict(text_input=HELLO, lora_task_id=np.array([1], np.uint64)), "'lora_task_id' is not supported: LoRA"),
    (dict(text_input=HELLO, guided_decoding_guide=s("{}")), "guided decoding is not supported"),
    (dict(text_input=HELLO, foo=i32(1)), r"unknown input\(s\) \['foo'\]"),
])
def test_malformed_or_unsupported_inputs_raise_errors_that_name_the_input(inputs, message):
    with pytest.raises(ValueError, match=message):
        parse(**inputs)


def test_neutral_values_of_unsupported_inputs_and_tensorrt_llm_defaults_are_accepted():
    req, opts = parse(text_input=HELLO, bad_words=s(""), stop_words=s("", "lo"), beam_width=i32(1), min_tokens=i32(1),
                      num_return_sequences=i32(1), length_penalty=np.array([1.0], np.float32),
                      return_log_probs=np.array([False]), top_p=np.array([0.0], np.float32))
    assert req.stop_strings == ("lo",) and req.sampling.top_p == 1.0 and req.max_new_tokens == CFG.default_max_tokens
    assert not req.ignore_eos and req.eos_token_ids is None and not opts.stream and opts.prompt == "hello"
    assert req.bad_words == () and req.min_tokens == 1


def test_valid_inputs_become_a_request_and_the_options_of_its_response():
    req, opts = parse(text_input=HELLO, max_tokens=i32(3), temperature=np.array([0.7], np.float32),
                      seed=np.array([2**64 - 1], np.uint64), budget=s("5"), method=s("chain"), end_id=i32(7),
                      stream=np.array([True]), exclude_input_in_output=np.array([True]), pad_id=i32(0),
                      return_num_output_tokens=np.array([True]), return_perf_metrics=np.array([True]))
    hello = tuple(tiny_tokenizer()("hello").input_ids)
    assert req.prompt_ids == hello and req.max_new_tokens == 3 and (req.method, req.budget) == ("chain", 5)
    assert req.sampling.temperature == pytest.approx(0.7) and req.sampling.seed == (2**64 - 1) % (1 << 63)
    assert req.eos_token_ids == (7,) and not req.ignore_eos  # end_id replaces the model's EOS ids, in the engine
    assert (opts.pad_id, opts.stream, opts.exclude_input) == (0, True, True)
    assert opts.num_output_tokens and opts.perf_metrics and not opts.num_input_tokens


def test_batched_tensors_split_into_rows_and_ragged_batches_are_refused():
    rows = split_batch({"text_input": np.array([[b"a"], [b"b"]], dtype=np.object_),
                        "max_tokens": np.array([[1], [2]], np.int32)})
    assert [(r["text_input"].tolist(), int(r["max_tokens"][0])) for r in rows] == [([b"a"], 1), ([b"b"], 2)]
    with pytest.raises(ValueError, match="same leading batch dimension"):
        split_batch({"text_input": np.array([[b"a"], [b"b"]], dtype=np.object_),
                     "max_tokens": np.array([[1]], np.int32)})


def live(tokens, accept, budgets):
    return SimpleNamespace(tokens=tokens, accept_lengths=accept, budgets=budgets, drafted=[n > 0 for n in budgets])


def test_spec_metrics_count_draft_tokens_of_drafted_rounds_and_accepted_ones_without_the_bonus():
    # (3-1) + (2-1) accepted of 6 + 4 drafted; none of none
    stats = spec_stats(live([5, 6, 7, 8, 9, 10, 11], [3, 1, 2], [6, 0, 4]))
    assert stats == {"acceptance_rate": pytest.approx(3 / 10), "total_accepted_draft_tokens": 3,
                     "total_draft_tokens": 10}
    assert spec_stats(live([5], [], [])) == {"acceptance_rate": 0.0, "total_accepted_draft_tokens": 0,
                                             "total_draft_tokens": 0}


def test_end_id_min_tokens_and_bad_words_become_the_engine_requests_processing():
    tok = tiny_tokenizer()
    req, _ = parse(text_input=HELLO, end_id=i32(-1), min_tokens=i32(3), bad_words=s("lo", "", "he"))
    assert req.eos_token_ids == () and req.min_tokens == 3  # end_id -1: no end id at all
    assert req.bad_words == tuple(tuple(tok(w, add_special_tokens=False).input_ids) for w in ("lo", "he"))
    assert parse(text_input=HELLO)[0].eos_token_ids is None  # the model's EOS ids


def test_text_pieces_hold_back_incomplete_characters_and_join_to_the_full_text():
    tok = tiny_tokenizer()
    ids = tok("é ok ü", add_special_tokens=False).input_ids  # 2-byte characters: one byte per token
    stream, pieces = TextStream(tok), []
    for n in range(1, len(ids) + 1):
        pieces.append(stream.piece(ids[:n], final=n == len(ids)))
    assert pieces[0] == "" and "".join(pieces) == "é ok ü" and "\ufffd" not in "".join(pieces)
    assert TextStream(tok, "prompt ").full(ids) == "prompt é ok ü"


def test_response_arrays_have_a_batch_dimension_and_pad_ragged_rows():
    stats = {"acceptance_rate": 0.5, "total_accepted_draft_tokens": 1, "total_draft_tokens": 2}
    rows = [{"text_output": "ab", "output_ids": [1, 2, 3], "accept_lengths": [2], "finish_reason": "length", **stats,
             "num_output_tokens": 3},
            {"text_output": "c", "output_ids": [4], "accept_lengths": [], "finish_reason": "eos", **stats,
             "num_output_tokens": 1, "num_input_tokens": 2}]
    out = response_arrays(rows, pad_id=9)
    assert out["text_output"].shape == (2, 1) and out["output_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert out["accept_lengths"].tolist() == [[2], [0]] and out["num_output_tokens"].tolist() == [[3], [1]]
    assert "num_input_tokens" not in out and "arrival_time_ns" not in out


def test_config_pbtxt_declares_the_interface_decoupled_mode_batching_and_instance_groups():
    text = config_pbtxt(CFG, True, "/root", instances=InstanceGroup(2, "gpu", (0, 1)))
    assert 'name: "ensemble"' in text and f"max_batch_size: {CFG.max_batch}" in text and "decoupled: true" in text
    assert 'name: "lora_config"\n    data_type: TYPE_INT32\n    dims: [ -1, 3 ]\n    optional: true' in text
    assert "count: 2\n    kind: KIND_GPU\n    gpus: [ 0, 1 ]" in text
    assert "count: 1\n    kind: KIND_CPU\n  }" in config_pbtxt(CFG, False, "/root")
    assert ServingConfig.from_params({k: v for k, v in CFG.to_params().items()}) == CFG


@pytest.mark.parametrize("kwargs, message", [
    (dict(count=0), "instances must be >= 1"), (dict(kind="tpu"), "instance kind must be one of"),
    (dict(kind="cpu", gpus=(0,)), "a GPU list needs instance kind 'gpu'"),
    (dict(kind="gpu", gpus=(1, 1)), "GPU ids must be distinct"),
])
def test_bad_instance_groups_are_refused_with_a_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        InstanceGroup(**kwargs)
