"""DFlash drafter: checkpoint round trip, validation, feature cache, reference parity."""

import json
import os
import sys

import pytest
import torch

from runtime.drafter import DrafterExecutor, load_drafter, random_drafter, save_drafter
from runtime.drafter.config import CONFIG_NAME, WEIGHTS_NAME

from tests.runtime.doubles import prefilled, tiny_target

BLOCK = 6  # root + 5 masks
LAYER_IDS = [0, 2]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def drafter(target):
    return random_drafter(target[1].config, num_layers=2, block_size=BLOCK, target_layer_ids=LAYER_IDS, seed=1,
                          mask_token_id=63)


def _taps(model, ids):
    return prefilled(model, ids, LAYER_IDS)[3]


def _draft(drafter, model, taps_chunks, root):
    ex = DrafterExecutor(drafter, model)
    state = ex.new_state(64)
    for taps in taps_chunks:
        ex.append_context(state, taps)
    return ex.draft([state], [root])[0]  # [L, V]


def test_draft_returns_one_marginal_per_future_position(target, drafter):
    hf, model = target
    taps = _taps(model, [5, 6, 7, 8])
    logits = _draft(drafter, model, [taps], root=9)
    assert logits.shape == (BLOCK - 1, 64)


def test_feature_cache_appended_in_chunks_equals_one_append(target, drafter):
    _, model = target
    taps = _taps(model, [5, 6, 7, 8, 9, 10, 11])
    whole = _draft(drafter, model, [taps], root=3)
    chunked = _draft(drafter, model, [taps[:3], taps[3:4], taps[4:]], root=3)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)


def test_save_load_round_trip_is_exact(tmp_path, target, drafter):
    _, model = target
    save_drafter(drafter, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {CONFIG_NAME, WEIGHTS_NAME}
    raw = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert raw["block_size"] == BLOCK
    assert raw["dflash_config"] == {"mask_token_id": 63, "target_layer_ids": LAYER_IDS}
    loaded = load_drafter(tmp_path, model.config)
    assert loaded.config == drafter.config
    for (k, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    taps = _taps(model, [1, 2, 3])
    assert torch.equal(_draft(loaded, model, [taps], 4), _draft(drafter, model, [taps], 4))


def test_checkpoint_keys_follow_the_zlab_format(tmp_path, drafter):
    from safetensors.torch import load_file

    save_drafter(drafter, tmp_path)
    keys = set(load_file(str(tmp_path / WEIGHTS_NAME)))
    layer = {f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"} | {
        "layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight",
        "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
        "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight"}
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} | layer <= keys
    assert not any("embed" in k or "lm_head" in k for k in keys)


def _edit_config(path, **changes):
    raw = json.loads((path / CONFIG_NAME).read_text())
    for key, value in changes.items():
        if key in ("mask_token_id", "target_layer_ids"):
            raw["dflash_config"][key] = value
        else:
            raw[key] = value
    (path / CONFIG_NAME).write_text(json.dumps(raw))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"vocab_size": 65}, "vocab_size 65 != target vocab_size 64"),
        ({"hidden_size": 32}, "hidden_size 32 != target hidden_size 64"),
        ({"target_layer_ids": [0, 7]}, r"target_layer_ids \[7\] are outside"),
        ({"num_target_layers": 30}, "num_target_layers 30"),
        ({"rope_theta": 500000.0}, "rope_theta 500000 != target rope_theta 10000"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
         r"rope_scaling \{'rope_type': 'linear', 'factor': 2.0\} != target rope_scaling None"),
    ],
)
def test_drafter_that_does_not_fit_the_target_is_rejected(tmp_path, target, drafter, changes, message):
    save_drafter(drafter, tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(ValueError, match=message):
        load_drafter(tmp_path, target[1].config)


def test_every_misfit_is_named_in_one_error(tmp_path, target, drafter):
    save_drafter(drafter, tmp_path)
    _edit_config(tmp_path, hidden_size=32, vocab_size=65, target_layer_ids=[9], rope_theta=1e6)
    with pytest.raises(ValueError, match="vocab_size 65 != .*; hidden_size 32 != .*; target_layer_ids .*; "
                                         r"rope_theta 1e\+06 != target rope_theta 10000"):
        load_drafter(tmp_path, target[1].config)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"layer_types": ["full_attention", "sliding_attention"]}, r"non-full-attention layers \[1\]"),
        ({"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}, r"non-full-attention layers \[1\]"),
        ({"is_causal": True}, "is_causal"),
        ({"attention_bias": True}, "attention_bias"),
        ({"architectures": ["DFlash2DraftModel"]}, "architectures"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping 30.0"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE type 'yarn'"),
    ],
)
def test_config_fields_the_drafter_does_not_compute_are_refused(tmp_path, target, drafter, changes, message):
    save_drafter(drafter, tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(ValueError, match="does not compute: .*" + message):
        load_drafter(tmp_path, target[1].config)


def test_drafter_rope_equals_hf_for_llama3_scaling():
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    from runtime.drafter import DrafterConfig

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    raw = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
           "intermediate_size": 128, "num_hidden_layers": 1, "vocab_size": 64, "block_size": 4,
           "rope_theta": 500000.0, "rope_scaling": scaling, "max_position_embeddings": 512,
           "dflash_config": {"mask_token_id": 0, "target_layer_ids": [1]}}
    ours = DrafterConfig.from_dict(raw).rotary()
    hf = Qwen3RotaryEmbedding(Qwen3Config(**{k: v for k, v in raw.items() if k != "rope_scaling"},
                                          rope_parameters=scaling | {"rope_theta": 500000.0}))
    assert torch.equal(ours.inv_freq, hf.inv_freq) and hf.attention_scaling == ours.attention_scaling == 1.0


def test_target_copies_in_the_safetensors_are_skipped(tmp_path, target, drafter):
    from safetensors.torch import load_file, save_file

    save_drafter(drafter, tmp_path)
    tensors = load_file(str(tmp_path / WEIGHTS_NAME))
    tensors["embed_tokens.weight"], tensors["lm_head.weight"] = torch.zeros(64, 64), torch.zeros(64, 64)
    save_file(tensors, str(tmp_path / WEIGHTS_NAME))
    assert "embed_tokens.weight" not in load_drafter(tmp_path, target[1].config).state_dict()


def test_missing_or_corrupt_checkpoint_files_are_named(tmp_path, target, drafter):
    cfg = target[1].config
    with pytest.raises(ValueError, match="does not exist"):
        load_drafter(tmp_path / "nope", cfg)
    save_drafter(drafter, tmp_path)
    (tmp_path / WEIGHTS_NAME).write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="corrupt or unreadable"):
        load_drafter(tmp_path, cfg)
    (tmp_path / WEIGHTS_NAME).unlink()
    with pytest.raises(ValueError, match=f"no {WEIGHTS_NAME}"):
        load_drafter(tmp_path, cfg)
    (tmp_path / CONFIG_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_drafter(tmp_path, cfg)
    (tmp_path / CONFIG_NAME).unlink()
    with pytest.raises(ValueError, match=f"no {CONFIG_NAME}"):
        load_drafter(tmp_path, cfg)


def test_weights_missing_a_key_are_rejected(tmp_path, target, drafter):
    from safetensors.torch import load_file, save_file

    save_drafter(drafter, tmp_path)
    tensors = load_file(str(tmp_path / WEIGHTS_NAME))
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / WEIGHTS_NAME))
    with pytest.raises(ValueError, match=r"missing \['layers.1.mlp.up_proj.weight'\]"):
        load_drafter(tmp_path, target[1].config)


def _reference_dflash():
    """dflash 0.1.0 (z-lab) if importable: installed, or unpacked at $DFLASH_SRC."""
    if os.environ.get("DFLASH_SRC"):
        sys.path.insert(0, os.environ["DFLASH_SRC"])
    try:
        from dflash.model import DFlashDraftModel, extract_context_feature
    except ImportError:
        pytest.skip("reference dflash not importable (pip download --no-deps dflash==0.1.0, unpack, "
                    "set DFLASH_SRC to the folder holding dflash/)")
    return DFlashDraftModel, extract_context_feature


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_marginals_match_reference_dflash_on_one_random_checkpoint(tmp_path, model_type):
    """Parity with z-lab's DFlashDraftModel.forward + compute_logits (same checkpoint)."""
    DFlashDraftModel, extract_context_feature = _reference_dflash()
    hf, model = tiny_target(model_type)
    drafter = random_drafter(model.config, num_layers=2, block_size=BLOCK, target_layer_ids=LAYER_IDS, seed=1,
                             mask_token_id=63)
    save_drafter(drafter, tmp_path)
    reference = DFlashDraftModel.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids, root = [5, 6, 7, 8, 9], 10
    with torch.no_grad():
        hidden = hf(torch.tensor(ids)[None], output_hidden_states=True).hidden_states
        context = extract_context_feature(hidden, LAYER_IDS)  # [1, P, F]
        block = torch.tensor([[root] + [63] * (BLOCK - 1)])
        out = reference(
            target_hidden=context,
            noise_embedding=hf.get_input_embeddings()(block),
            position_ids=torch.arange(len(ids) + BLOCK)[None],
        )
        expected = reference.compute_logits(out[:, 1:], hf.lm_head)[0]
    ours = _draft(drafter, model, [context[0, :2], context[0, 2:]], root)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_zlab_format_checkpoint_gives_the_reference_its_rope(tmp_path):
    """A published-layout config.json (llama3 rope_scaling) means the same RoPE to both."""
    DFlashDraftModel, _ = _reference_dflash()
    from runtime.drafter import DrafterConfig

    from tests.runtime.hf_checkpoints import write_tiny_checkpoint, write_tiny_drafter

    head = write_tiny_drafter(write_tiny_checkpoint("llama", tmp_path / "llama"), tmp_path / "dflash")
    reference = DFlashDraftModel.from_pretrained(str(head), dtype=torch.float32)
    ours = DrafterConfig.load(head).rotary()
    assert torch.equal(ours.inv_freq, reference.rotary_emb.inv_freq)
    assert reference.target_layer_ids == list(DrafterConfig.load(head).target_layer_ids)
