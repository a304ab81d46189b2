"""`runtime.loader`: every --target kind and family through ONE path, dtypes, EOS ids,
drafter resolution, and errors a user can act on."""

import json
import shutil

import pytest
import torch

from runtime.loader import SUPPORTED_MODEL_TYPES, encode_prompt, load_hf_checkpoint, load_models, models_from_hf
from tests.runtime.doubles import prefilled
from tests.runtime.hf_checkpoints import EOT, FAMILIES, IM_END, write_tiny_checkpoint, write_tiny_drafter

PROMPT = [257, 84, 82, 68, 81, 198, 71, 72, 258, 198, 257, 64]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> dir: llama sharded (3 shards asked), qwen2 in bf16, qwen3 plain fp32."""
    root = tmp_path_factory.mktemp("targets")
    return {
        "llama": write_tiny_checkpoint("llama", root / "llama", shards=3),
        "qwen2": write_tiny_checkpoint("qwen2", root / "qwen2", dtype=torch.bfloat16),
        "qwen3": write_tiny_checkpoint("qwen3", root / "qwen3"),
    }


def _ours_and_hf_logits(directory, dtype=None):
    from transformers import AutoModelForCausalLM

    loaded = load_models(str(directory), "none", dtype=dtype)
    ours = prefilled(loaded.target, PROMPT)[2][0]
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=loaded.dtype).eval()
    with torch.no_grad():
        ref = hf(torch.tensor(PROMPT)[None]).logits[0, -1]
    return loaded, ours, ref


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_loads_and_its_fp32_logits_equal_hf(checkpoints, family):
    loaded, ours, ref = _ours_and_hf_logits(checkpoints[family], dtype="float32")
    assert loaded.dtype == torch.float32 and loaded.drafter is None
    assert (ours - ref).abs().max().item() <= 1e-4


def test_sharded_checkpoint_is_read_through_its_index(checkpoints):
    directory = checkpoints["llama"]
    assert (directory / "model.safetensors.index.json").is_file()
    assert len(list(directory.glob("model-*.safetensors"))) > 1
    assert load_models(str(directory), "none").target.config.rope_scaling  # llama3 scaling came along


def test_bf16_checkpoint_loads_once_as_bf16_sharing_hf_storage(checkpoints):
    ckpt = load_hf_checkpoint(str(checkpoints["qwen2"]))  # dtype None = the checkpoint's own
    loaded = models_from_hf(ckpt, "none")
    assert loaded.dtype == torch.bfloat16 and loaded.target.lm_head.weight.dtype == torch.bfloat16
    ours = dict(loaded.target.named_parameters())
    for name, param in ckpt.model.named_parameters():
        assert ours[name.removeprefix("model.")].data_ptr() == param.data_ptr(), name
    _, logits, ref = _ours_and_hf_logits(checkpoints["qwen2"])
    assert logits.dtype == torch.bfloat16 and logits.argmax() == ref.argmax()


def test_legacy_torch_dtype_field_is_the_checkpoints_dtype(tmp_path, checkpoints):
    directory = shutil.copytree(checkpoints["qwen3"], tmp_path / "legacy")
    raw = json.loads((directory / "config.json").read_text())
    raw.pop("dtype")
    (directory / "config.json").write_text(json.dumps(raw | {"torch_dtype": "bfloat16"}))  # transformers 4.x
    assert load_models(str(directory), "none").dtype == torch.bfloat16


def test_dtype_can_be_asked_for_by_name_and_a_bad_one_is_refused(checkpoints):
    assert load_models(str(checkpoints["qwen3"]), "none", dtype="bfloat16").dtype == torch.bfloat16
    assert load_models(str(checkpoints["qwen2"]), "none", dtype="auto").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype 'int8' is not supported; pass auto or one of float32, bfloat16"):
        load_models(str(checkpoints["qwen3"]), "none", dtype="int8")


@pytest.mark.parametrize("model_type", ["mistral", "gpt2", "deepseek_v9"])
def test_other_model_types_are_refused_with_the_supported_list(tmp_path, checkpoints, model_type):
    directory = shutil.copytree(checkpoints["qwen3"], tmp_path / "other")
    raw = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(raw | {"model_type": model_type}))
    with pytest.raises(ValueError, match=f"model_type '{model_type}' is not supported; supported: "
                                         + ", ".join(SUPPORTED_MODEL_TYPES)):
        load_models(str(directory), "none")


def test_eos_ids_are_the_union_of_generation_config_config_and_tokenizer(checkpoints):
    loaded = load_models(str(checkpoints["qwen3"]), "none")
    assert loaded.tokenizer.eos_token_id == IM_END
    assert EOT in loaded.eos_token_ids  # named only in generation_config.json
    assert loaded.eos_token_ids == (256, IM_END, EOT)


def test_chat_prompt_uses_the_checkpoints_template(checkpoints):
    tokenizer = load_models(str(checkpoints["llama"]), "none").tokenizer
    chat = tokenizer.decode(encode_prompt(tokenizer, "hi", chat=True))
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(encode_prompt(tokenizer, "hi", chat=False)) == "hi"
    with pytest.raises(ValueError, match="the prompt is empty"):
        encode_prompt(tokenizer, "  ", chat=True)


def test_bad_target_paths_say_what_to_pass(tmp_path, checkpoints):
    with pytest.raises(ValueError, match="does not exist; pass 'embedded', a Hugging Face model directory or a .gguf"):
        load_models(str(tmp_path / "nowhere"), "none")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="is a file but not a .gguf"):
        load_models(str(tmp_path / "weights.bin"), "none")
    with pytest.raises(ValueError, match=r"has no config.json and no \*.safetensors weights and no tokenizer"):
        load_models(str(tmp_path), "none")
    partial = shutil.copytree(checkpoints["qwen3"], tmp_path / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (partial / name).unlink()
    with pytest.raises(ValueError, match=r"has no tokenizer \(tokenizer.json"):
        load_models(str(partial), "none")


def test_default_drafter_is_refused_for_a_target_without_a_shipped_head(checkpoints):
    shipped_for_none = "no DFlash drafter is shipped for qwen3; pass --drafter DIR .* or --drafter none"
    with pytest.raises(ValueError, match=shipped_for_none):
        load_models(str(checkpoints["qwen3"]))
    with pytest.raises(ValueError, match="--drafter '/no/such/dir' is not a directory"):
        load_models(str(checkpoints["qwen3"]), "/no/such/dir")


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_zlab_format_drafter_loads_for_its_target(tmp_path, checkpoints, family):
    head = write_tiny_drafter(checkpoints[family], tmp_path / "dflash", target_copies=True)
    loaded = load_models(str(checkpoints[family]), str(head))
    assert loaded.drafter is not None and loaded.drafter.config.target_layer_ids == (0, 1)
    assert next(loaded.drafter.parameters()).dtype == loaded.dtype
    assert loaded.drafter.config.rope_scaling == loaded.target.config.rope_scaling


def test_drafter_of_another_target_is_refused_naming_both_values(tmp_path, checkpoints):
    head = write_tiny_drafter(checkpoints["qwen3"], tmp_path / "dflash")
    with pytest.raises(ValueError, match=r"rope_theta 1e\+06 != target rope_theta 500000; rope_scaling None != "
                                         r"target rope_scaling \{'rope_type': 'llama3'"):
        load_models(str(checkpoints["llama"]), str(head))


def test_embedded_target_gets_the_shipped_head(embedded_checkpoint):
    from runtime.drafter import DEFAULT_DRAFTER, DrafterConfig
    from runtime.loader import MODEL_NAME

    loaded = models_from_hf(embedded_checkpoint, "default")
    assert (loaded.name, loaded.source, loaded.dtype) == (MODEL_NAME, "embedded", torch.float32)
    assert loaded.drafter.config == DrafterConfig.load(DEFAULT_DRAFTER)
    assert loaded.target.config.rope_theta == loaded.drafter.config.rope_theta == 100_000.0
    assert loaded.tokenizer.eos_token_id in loaded.eos_token_ids


def test_loading_reads_offline_without_turning_the_process_offline(tmp_path, monkeypatch):
    """Every read passes local_files_only; HF_HUB_OFFLINE is left as the caller had it."""
    import os

    from runtime.loader import load_hf_checkpoint
    from tests.runtime.hf_checkpoints import write_tiny_checkpoint

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    load_hf_checkpoint(str(write_tiny_checkpoint("llama", tmp_path / "llama")))
    assert "HF_HUB_OFFLINE" not in os.environ
