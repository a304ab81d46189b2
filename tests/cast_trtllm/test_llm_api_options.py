"""`--extra-llm-api-options`: TensorRT-LLM's DFlash block unchanged, CAST's own fields, and
the one SpecConfig they map onto (every value checked once, every error naming its field)."""

from __future__ import annotations

import pytest

from cast_trtllm.llm_api_options import load_llm_api_options, parse_llm_api_options
from cast_trtllm.spec_config import SpecConfig

# as in TensorRT-LLM's DFlash documentation (PyTorch backend)
TRTLLM_DFLASH_YAML = """\
speculative_config:
  decoding_type: DFlash
  max_draft_len: 15
  speculative_model: z-lab/Qwen3-8B-DFlash-b16
  mask_token_id: 151669
  target_layer_ids: [1, 9, 17, 25, 33]
  acceptance_rate_threshold: 0.1
  acceptance_rate_window_size: 8
  draft_len_schedule: {1: 15, 8: 7}
  max_concurrency: 32
kv_cache_config:
  free_gpu_memory_fraction: 0.9
"""


def test_trtllm_dflash_yaml_is_accepted_unchanged_and_means_the_chain(tmp_path):
    path = tmp_path / "dflash.yaml"
    path.write_text(TRTLLM_DFLASH_YAML)
    opts = load_llm_api_options(path)
    assert opts.spec.method == "chain" and opts.spec.max_draft_len == 15 and opts.spec.max_concurrency == 32
    assert opts.speculative_model == "z-lab/Qwen3-8B-DFlash-b16"
    assert opts.expect_drafter == {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}
    assert opts.ignored_keys == ("kv_cache_config",)
    text = "\n".join(opts.notes)
    for field in ("acceptance_rate_threshold: ignored", "acceptance_rate_window_size: ignored",
                  "draft_len_schedule: ignored", "max_concurrency 32 -> max_concurrency",
                  "decoding_type DFlash -> method chain", "kv_cache_config: ignored"):
        assert field in text


# every field of TensorRT-LLM's DFlashDecodingConfig and its DecodingBaseConfig (llmapi/llm_args.py)
ALL_DFLASH_FIELDS = {
    "decoding_type": "DFlash", "max_draft_len": 15, "max_total_draft_tokens": 15,
    "speculative_model": "z-lab/Qwen3-8B-DFlash-b16", "max_concurrency": 32, "draft_len_schedule": {1: 15, 8: 7},
    "load_format": "auto", "acceptance_rate_window_size": 8, "acceptance_rate_threshold": 0.1,
    "use_rejection_sampling": False, "allow_advanced_sampling": False, "advanced_sampling_mode": "full",
    "enable_penalty": False, "mask_token_id": 151669, "target_layer_ids": [1, 9, 17], "attention_backend": "VANILLA",
}
# TensorRT-LLM 1.4 adds these (llm-api/reference/DFlashDecodingConfig.html, 1.4.0rc1)
DFLASH_14_FIELDS = {**ALL_DFLASH_FIELDS, "moe_backend": "CUTLASS", "spec_dec_variant": 2, "context_recompute_tail": 64,
                    "skip_ctx_buffer_budget_check": True, "attention_backend": "FA4"}


@pytest.mark.parametrize("fields", [ALL_DFLASH_FIELDS, DFLASH_14_FIELDS], ids=["1.3", "1.4"])
def test_every_trtllm_dflash_field_is_accepted_and_each_gets_one_note(fields):
    opts = parse_llm_api_options({"speculative_config": fields})
    assert opts.spec.method == "chain" and opts.spec.max_draft_len == 15 and opts.spec.max_concurrency == 32
    assert opts.expect_drafter == {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17]}
    for field in fields:  # each field maps to behaviour or says why it is ignored
        assert sum(note.startswith(field) for note in opts.notes) == 1, field
    assert "max_total_draft_tokens: ignored" in "\n".join(opts.notes)


def test_max_total_draft_tokens_is_the_cast_budget():
    opts = parse_llm_api_options({"speculative_config": {"decoding_type": "CAST", "max_total_draft_tokens": 31}})
    assert opts.spec.budget == 31
    with pytest.raises(ValueError, match="max_total_draft_tokens: 31 disagrees with budget 7"):
        parse_llm_api_options({"speculative_config": {"decoding_type": "CAST", "max_total_draft_tokens": 31,
                                                      "budget": 7}})


@pytest.mark.parametrize("field, value, expected", [
    ("use_rejection_sampling", "yes", "true or false"),
    ("attention_backend", "FLASHINFER", "'VANILLA', 'TRTLLM' or 'FA4'"),
    ("moe_backend", "FAST", "one of"),
    ("spec_dec_variant", 0, "an integer > 0"),
    ("advanced_sampling_mode", "fast", "one of"),
    ("acceptance_rate_threshold", 1.5, r"a number in \[0, 1\]"),
    ("draft_len_schedule", [4, 2], "a mapping of batch size"),
    ("max_total_draft_tokens", 0, "an integer >= 1"),
])
def test_a_trtllm_field_with_a_value_trtllm_refuses_names_what_it_accepts(field, value, expected):
    with pytest.raises(ValueError, match=rf"speculative_config\.{field}: .*{expected}"):
        parse_llm_api_options({"speculative_config": {"decoding_type": "DFlash", field: value}})


def test_an_unknown_field_says_it_is_neither_trtllm_nor_cast_and_what_to_use():
    with pytest.raises(ValueError, match=r"speculative_config\.beam_width: not a field of TensorRT-LLM's DFlash "
                                         r"config nor of CAST's; remove it or use one of \[.*'use_rejection_sampling'"):
        parse_llm_api_options({"speculative_config": {"decoding_type": "DFlash", "beam_width": 2}})


def test_cast_fields_map_onto_the_spec_config():
    opts = parse_llm_api_options({"speculative_config": {
        "decoding_type": "CAST", "max_draft_len": 7, "budget": 31, "rank_cap": 4, "width_profile": "p.json",
        "width_rule": "marginal", "draft_gate": False, "speculative_model_dir": "/d"}})
    assert opts.spec == SpecConfig(method="cast", max_draft_len=7, budget=31, rank_cap=4, width_profile="p.json",
                                   width_rule="marginal", draft_gate=False)
    assert opts.speculative_model == "/d"
    assert parse_llm_api_options(None).spec is None


def test_the_yaml_overlays_the_flags_it_names_and_keeps_the_rest():
    base = SpecConfig(budget=15, rank_cap=6)
    opts = parse_llm_api_options({"speculative_config": {"decoding_type": "CAST", "width_rule": "marginal"}}, base)
    assert (opts.spec.budget, opts.spec.rank_cap, opts.spec.width_rule) == (15, 6, "marginal")


@pytest.mark.parametrize("block, field", [
    ({"max_draft_len": 15}, "decoding_type"),
    ({"decoding_type": "Eagle", "max_draft_len": 15}, "decoding_type"),
    ({"decoding_type": "CAST", "max_draft_len": 0}, "max_draft_len"),
    ({"decoding_type": "CAST", "max_draft_len": True}, "max_draft_len"),
    ({"decoding_type": "CAST", "budget": -1}, "budget"),
    ({"decoding_type": "CAST", "budget": "wide"}, "budget"),
    ({"decoding_type": "CAST", "rank_cap": 0}, "rank_cap"),
    ({"decoding_type": "CAST", "width_profile": 3}, "width_profile"),
    ({"decoding_type": "CAST", "width_rule": "greedy"}, "width_rule"),
    ({"decoding_type": "CAST", "speculative_model": ""}, "speculative_model"),
    ({"decoding_type": "CAST", "speculative_model": "a", "speculative_model_dir": "b"}, "speculative_model_dir"),
    ({"decoding_type": "CAST", "beam_width": 2}, "beam_width"),
    ({"decoding_type": "DFlash", "max_draft_len": 15, "budget": 7}, "budget"),
])
def test_invalid_speculative_config_names_the_field(block, field):
    with pytest.raises(ValueError, match=rf"speculative_config\.{field}"):
        parse_llm_api_options({"speculative_config": block})


def test_bad_yaml_and_non_mapping_are_rejected(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("speculative_config: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_llm_api_options(path)
    with pytest.raises(ValueError, match="cannot be read"):
        load_llm_api_options(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="speculative_config: must be a mapping"):
        parse_llm_api_options({"speculative_config": "CAST"})


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "beam"}, "method must be one of"),
    ({"budget": 1.5}, "budget must be 'auto' or an integer >= 0"),
    ({"rank_cap": 0}, "rank_cap must be an integer >= 1"),
    ({"max_concurrency": 0}, "max_concurrency must be an integer >= 1"),
])
def test_spec_config_rejects_bad_values_with_a_sentence(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpecConfig(**kwargs)


def test_spec_config_caps_budgets_at_what_the_drafter_can_offer():
    spec = SpecConfig(rank_cap=8)
    assert spec.max_nodes(15) == 120 and SpecConfig(budget="7").budget == 7
    spec.check_budget_fits(120, 15)
    with pytest.raises(ValueError, match=r"budget 100000 exceeds the 120 nodes the drafter can offer \(L = 15 positions × K = 8"):
        spec.check_budget_fits(100000, 15)
    with pytest.raises(ValueError, match="max_draft_len 16 exceeds the drafter's block of L = 15"):
        SpecConfig(max_draft_len=16).draft_positions(15)


def test_top_level_batch_and_token_limits_are_honoured_and_the_rest_reported():
    opts = parse_llm_api_options({"max_batch_size": 8, "max_num_tokens": 256, "max_seq_len": 4096,
                                  "kv_cache_config": {"free_gpu_memory_fraction": 0.9}})
    assert opts.engine == {"max_batch_size": 8, "max_num_tokens": 256}
    assert opts.ignored_keys == ("kv_cache_config", "max_seq_len")
    assert any(n.startswith("max_batch_size 8 -> requests") for n in opts.notes)
    with pytest.raises(ValueError, match="max_num_tokens: must be an integer >= 1"):
        parse_llm_api_options({"max_num_tokens": 0})


def test_decoding_config_objects_carry_tensorrt_llm_fields_and_validate_on_construction():
    from cast_trtllm.decoding_config import CASTDecodingConfig, DFlashDecodingConfig

    cfg = DFlashDecodingConfig(**{k: v for k, v in DFLASH_14_FIELDS.items() if k != "decoding_type"})
    assert cfg.max_draft_len == 15 and cfg.decoding_type == "DFlash" and cfg.options.spec.method == "chain"
    assert CASTDecodingConfig(budget="auto", rank_cap=4).options.spec.rank_cap == 4
    with pytest.raises(ValueError, match="speculative_config.spec_dec_variant"):
        DFlashDecodingConfig(spec_dec_variant=0)
    with pytest.raises(ValueError, match="decoding_type"):
        DFlashDecodingConfig(decoding_type="CAST")
