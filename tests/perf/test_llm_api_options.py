from __future__ import annotations

import pytest

from cast_trtllm.llm_api_options import load_llm_api_options, parse_llm_api_options


def test_cast_speculative_config_is_parsed_from_yaml(tmp_path):
    path = tmp_path / "opts.yaml"
    path.write_text("speculative_config:\n  decoding_type: CAST\n  max_draft_len: 15\n"
                    "  speculative_model: /models/dflash\n  budget: 31\n  width_profile: p.json\n"
                    "kv_cache_config:\n  free_gpu_memory_fraction: 0.9\n")
    opts = load_llm_api_options(path)
    spec = opts.speculative_config
    assert (spec.method, spec.max_draft_len, spec.speculative_model, spec.budget, spec.width_profile) == (
        "cast", 15, "/models/dflash", 31, "p.json")
    assert opts.ignored_keys == ("kv_cache_config",)


def test_defaults_and_the_dflash_chain():
    spec = parse_llm_api_options({"speculative_config": {"decoding_type": "CAST", "max_draft_len": 15}}).speculative_config
    assert spec.budget == "auto" and spec.speculative_model is None
    chain = parse_llm_api_options({"speculative_config": {"decoding_type": "DFlash", "max_draft_len": 15,
                                                          "speculative_model_dir": "/d"}}).speculative_config
    assert chain.method == "chain" and chain.speculative_model == "/d"
    assert parse_llm_api_options(None).speculative_config is None


@pytest.mark.parametrize("block, field", [
    ({"max_draft_len": 15}, "decoding_type"),
    ({"decoding_type": "Eagle", "max_draft_len": 15}, "decoding_type"),
    ({"decoding_type": "CAST"}, "max_draft_len"),
    ({"decoding_type": "CAST", "max_draft_len": 0}, "max_draft_len"),
    ({"decoding_type": "CAST", "max_draft_len": True}, "max_draft_len"),
    ({"decoding_type": "CAST", "max_draft_len": 15, "budget": -1}, "budget"),
    ({"decoding_type": "CAST", "max_draft_len": 15, "budget": "wide"}, "budget"),
    ({"decoding_type": "CAST", "max_draft_len": 15, "width_profile": 3}, "width_profile"),
    ({"decoding_type": "CAST", "max_draft_len": 15, "speculative_model": ""}, "speculative_model"),
    ({"decoding_type": "CAST", "max_draft_len": 15, "speculative_model": "a", "speculative_model_dir": "b"},
     "speculative_model_dir"),
    ({"decoding_type": "CAST", "max_draft_len": 15, "beam_width": 2}, "beam_width"),
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
    with pytest.raises(ValueError, match="speculative_config: must be a mapping"):
        parse_llm_api_options({"speculative_config": "CAST"})
