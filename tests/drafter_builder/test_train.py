"""DFlash drafter training: the batched block pass equals the runtime draft call (full and
reduced draft vocabulary), a few steps lower the loss (hard labels and distillation), a
resumed run continues the same run exactly, a run segment stops where asked, a grown head
drafts as before and trains its new layers, and a restarted schedule runs a whole cosine."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from drafter_builder.blocks import (IGNORE, FrozenTarget, block_hidden, block_labels, block_loss, sample_anchors,
                                    soft_block_loss, target_block_logprobs, to_draft_labels)
from drafter_builder.train import TrainConfig, TrainerState, _lr_at, acceptance, train
from runtime.drafter import DrafterExecutor, load_drafter, random_drafter, save_drafter, with_layers
from runtime.drafter.vocab import DraftHead, target_to_draft
from runtime.model.layers import Rotary, default_inv_freq
from runtime.model.llama import LlamaTarget, TargetConfig

TINY = TargetConfig(
    vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8,
    intermediate_size=48, rms_norm_eps=1e-6, context_window=128,
)


def _tiny_target(seed: int = 0) -> LlamaTarget:
    torch.manual_seed(seed)
    target = LlamaTarget(TINY, Rotary(default_inv_freq(TINY.head_dim, 10_000.0)))
    with torch.no_grad():
        for p in target.parameters():
            p.normal_(0, 0.3)
    return target.eval().requires_grad_(False)


def _sequence(length: int, taps_width: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, TINY.vocab_size, (length,), generator=gen, dtype=torch.int32)
    return {"ids": ids, "prompt_len": 4, "taps": torch.randn(length - 1, taps_width, generator=gen).half()}


@pytest.mark.parametrize("draft_vocab", [None, torch.tensor([0, 3, 5, 9, 17, 40, 63])])
def test_block_pass_equals_runtime_draft_per_anchor(draft_vocab):
    target = _tiny_target()
    drafter = random_drafter(TINY, num_layers=2, block_size=4, target_layer_ids=[1, 3], mask_token_id=0, init_std=0.2,
                             draft_vocab_ids=draft_vocab)
    rec = _sequence(14, 2 * TINY.hidden_size, seed=1)
    anchors = torch.tensor([4, 7, 12])
    frozen = FrozenTarget(target.embed_tokens.weight, target.lm_head.weight)
    hidden = block_hidden(drafter, frozen.embed_weight, drafter.config.rotary(), rec["taps"].float(), rec["ids"],
                          anchors)
    batched = DraftHead(frozen.lm_head_weight, drafter.d2t)(hidden)  # [n, L, V], -inf outside the draft vocab
    ex = DrafterExecutor(drafter, target)
    for j, a in enumerate(anchors.tolist()):
        state = ex.new_state(32)
        ex.append_context(state, rec["taps"][:a].float())
        torch.testing.assert_close(batched[j], ex.draft([state], [int(rec["ids"][a])])[0], rtol=1e-4, atol=1e-4)
    if draft_vocab is not None:
        outside = torch.ones(TINY.vocab_size, dtype=torch.bool)
        outside[draft_vocab] = False
        assert torch.isneginf(batched[..., outside]).all() and torch.isfinite(batched[..., ~outside]).all()


def test_labels_outside_the_draft_vocabulary_are_ignored_and_the_rest_renumbered():
    t2d = target_to_draft(torch.tensor([2, 5, 7]), vocab_size=10)
    labels = torch.tensor([[5, 3, IGNORE], [7, 2, 9]])
    assert to_draft_labels(labels, t2d).tolist() == [[1, IGNORE, IGNORE], [2, 0, IGNORE]]


def test_labels_past_the_end_are_ignored_and_anchors_stay_in_the_response():
    ids = torch.arange(10)
    assert block_labels(ids, torch.tensor([7]), 3).tolist() == [[8, 9, IGNORE]]
    anchors = sample_anchors(prompt_len=4, length=10, count=100, gen=torch.Generator().manual_seed(0))
    assert anchors.tolist() == list(range(4, 9))


def test_validation_counts_full_blocks_only_and_skips_a_response_shorter_than_a_block():
    target = _tiny_target()
    drafter = random_drafter(TINY, num_layers=1, block_size=4, target_layer_ids=[1, 3], mask_token_id=0)
    frozen = FrozenTarget(target.embed_tokens.weight, target.lm_head.weight)
    full, short = _sequence(12, 2 * TINY.hidden_size, seed=2), _sequence(6, 2 * TINY.hidden_size, seed=3)
    assert acceptance(drafter, frozen, [full])["anchors"] == 12 - 4 - 3  # anchors 4..8 have 3 labels each
    assert acceptance(drafter, frozen, [full, short]) == acceptance(drafter, frozen, [full])
    with pytest.raises(ValueError, match="no held-out anchor has a full block"):
        acceptance(drafter, frozen, [short])


def test_a_few_training_steps_lower_the_loss_on_two_short_sequences():
    target = _tiny_target()
    drafter = random_drafter(TINY, num_layers=1, block_size=4, target_layer_ids=[1, 3], mask_token_id=0)
    records = [_sequence(16, 2 * TINY.hidden_size, seed=s) for s in (2, 3)]
    cfg = TrainConfig(budget_s=30.0, anchors_per_seq=8, seqs_per_step=2, lr=3e-2, warmup_steps=1, max_steps=25)
    log = train(drafter, FrozenTarget(target.embed_tokens.weight, target.lm_head.weight), itertools.cycle(records), cfg).log
    assert len(log) == 25
    assert sum(e["loss"] for e in log[-3:]) / 3 < 0.8 * sum(e["loss"] for e in log[:3]) / 3


def test_a_run_resumed_from_its_saved_state_equals_the_uninterrupted_run():
    target = _tiny_target()
    frozen = FrozenTarget(target.embed_tokens.weight, target.lm_head.weight)
    records = [_sequence(16, 2 * TINY.hidden_size, seed=s) for s in (2, 3, 4)]

    def fresh():
        return random_drafter(TINY, num_layers=1, block_size=4, target_layer_ids=[1, 3], mask_token_id=0)

    def cfg(steps):  # warm-up only: the lr schedule does not depend on wall time
        return TrainConfig(budget_s=600.0, anchors_per_seq=4, lr=1e-2, warmup_steps=100, max_steps=steps)

    whole = fresh()
    train(whole, frozen, itertools.cycle(records), cfg(8))
    first, saved = fresh(), []
    state = train(first, frozen, itertools.cycle(records), cfg(4), on_save=lambda st: saved.append(copy.deepcopy(st.to_dict())))
    rest = itertools.islice(itertools.cycle(records), 4, None)  # the stream continues where it stopped
    resumed_state = TrainerState(**saved[-1])
    train(first, frozen, rest, cfg(8), state=resumed_state)
    assert resumed_state.step == 8 and state.step == 4
    for (name, a), (_, b) in zip(whole.state_dict().items(), first.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)


def test_a_resumed_run_ramps_back_up_to_the_cosine_over_its_rewarm_steps_instead_of_jumping():
    cfg = TrainConfig(budget_s=100.0, lr=1e-3, warmup_steps=10, rewarm_steps=4)
    scheduled = _lr_at(cfg, 500, 50.0)  # run_start_step 0: a fresh run's plain cosine
    assert scheduled == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    ramp = [_lr_at(cfg, step, 50.0, run_start_step=500) for step in range(500, 506)]
    assert ramp == pytest.approx([scheduled * f for f in (0.25, 0.5, 0.75, 1.0, 1.0, 1.0)])
    assert _lr_at(TrainConfig(budget_s=100.0, lr=1e-3), 500, 50.0, run_start_step=500) == scheduled  # default: jumps
    with pytest.raises(ValueError, match="rewarm_steps"):
        TrainConfig(budget_s=100.0, rewarm_steps=-1)


def test_a_restarted_schedule_runs_a_whole_cosine_from_its_start_to_the_end_of_the_box():
    cfg = TrainConfig(budget_s=100.0, lr=1e-3, warmup_steps=10, schedule_start_s=60.0)
    lrs = [_lr_at(cfg, 500, elapsed, run_start_step=400) for elapsed in (60.0, 80.0, 100.0)]
    assert lrs == pytest.approx([1e-3, 1e-3 * (0.1 + 0.9 * 0.5), 1e-4])  # peak, middle, floor
    assert _lr_at(TrainConfig(budget_s=100.0, lr=1e-3, warmup_steps=10), 500, 60.0) < 0.5 * lrs[0]  # the old tail
    with pytest.raises(ValueError, match="schedule_start_s"):
        TrainConfig(budget_s=100.0, schedule_start_s=100.0)


@pytest.mark.parametrize("draft_vocab", [None, torch.arange(0, TINY.vocab_size, 2)])  # half the labels count
def test_a_grown_head_drafts_exactly_as_before_and_trains_its_new_layers(tmp_path, draft_vocab):
    target = _tiny_target()
    frozen = FrozenTarget(target.embed_tokens.weight, target.lm_head.weight)
    drafter = random_drafter(TINY, num_layers=2, block_size=4, target_layer_ids=[1, 3], mask_token_id=0, init_std=0.2,
                             draft_vocab_ids=draft_vocab)
    grown = with_layers(drafter, 3, seed=1)
    assert grown.config.num_hidden_layers == 3 and drafter.config.num_hidden_layers == 2
    rec = _sequence(14, 2 * TINY.hidden_size, seed=1)
    anchors = torch.tensor([4, 7, 12])
    before, after = (block_hidden(d, frozen.embed_weight, d.config.rotary(), rec["taps"].float(), rec["ids"], anchors)
                     for d in (drafter, grown))
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)
    save_drafter(grown, tmp_path)
    loaded = load_drafter(tmp_path, TINY)
    drafts = []
    for head in (loaded, drafter):
        ex = DrafterExecutor(head, target)
        state = ex.new_state(32)
        ex.append_context(state, rec["taps"][:7].float())
        drafts.append(ex.draft([state], [int(rec["ids"][7])]))
    torch.testing.assert_close(drafts[0], drafts[1], rtol=0, atol=1e-5)
    new = {k: v.clone() for k, v in grown.state_dict().items() if k.startswith("layers.2.")}
    cfg = TrainConfig(budget_s=30.0, anchors_per_seq=8, lr=1e-2, warmup_steps=1, max_steps=3)
    train(grown, frozen, itertools.cycle([rec]), cfg)
    moved = {k for k, v in grown.state_dict().items() if k in new and not torch.equal(v, new[k])}
    assert {"layers.2.self_attn.o_proj.weight", "layers.2.self_attn.q_proj.weight",
            "layers.2.mlp.down_proj.weight", "layers.2.mlp.up_proj.weight"} <= moved
    with pytest.raises(ValueError, match="grows a head"):
        with_layers(drafter, 2)


def test_target_block_logprobs_are_the_lm_head_law_of_each_slot_renormalized_over_the_draft_vocabulary():
    target = _tiny_target()
    draft_vocab = torch.tensor([0, 3, 5, 9, 17, 40, 63])
    head = DraftHead(target.lm_head.weight, draft_vocab - torch.arange(draft_vocab.numel()))
    final = torch.randn(13, TINY.hidden_size)  # taps of a 14-token sequence
    anchors = torch.tensor([4, 9, 11])
    logp, valid = target_block_logprobs(final, head, anchors, num_draft=3)
    assert valid.tolist() == [[True] * 3, [True] * 3, [True, True, False]]  # slot 3 of anchor 11 is ids[14]
    for j, a in enumerate(anchors.tolist()):
        for k in range(3):
            if valid[j, k]:
                expected = torch.log_softmax(final[a + k] @ target.lm_head.weight[draft_vocab].T, -1)
                torch.testing.assert_close(logp[j, k], expected)


def test_the_soft_loss_against_a_one_hot_law_is_the_hard_loss():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 7, generator=gen)
    labels = torch.randint(0, 7, (3, 4), generator=gen)
    labels[2, 3] = IGNORE
    weights = torch.tensor([1.0, 0.5, 0.25, 0.125])
    one_hot = torch.log(torch.nn.functional.one_hot(labels.clamp_min(0), 7).float())
    soft = soft_block_loss(logits, one_hot, labels != IGNORE, weights)
    torch.testing.assert_close(soft, block_loss(logits, labels, weights))


def test_distillation_steps_move_the_head_toward_the_target_law():
    target = _tiny_target()
    frozen = FrozenTarget(target.embed_tokens.weight, target.lm_head.weight)
    drafter = random_drafter(TINY, num_layers=1, block_size=4, target_layer_ids=[1, TINY.num_layers - 1], mask_token_id=0)
    records = [_sequence(16, 2 * TINY.hidden_size, seed=s) for s in (2, 3)]

    def kl_to_target() -> float:
        head, rec = DraftHead(frozen.lm_head_weight, None), records[0]
        anchors = torch.arange(4, 12)
        with torch.no_grad():
            hidden = block_hidden(drafter, frozen.embed_weight, drafter.config.rotary(), rec["taps"].float(),
                                  rec["ids"], anchors)
            logp, valid = target_block_logprobs(rec["taps"][:, TINY.hidden_size:].float(), head, anchors, 3)
            q = torch.log_softmax(head.draft_logits(hidden), -1)
        return float(((logp.exp() * (logp - q)).sum(-1) * valid).sum() / valid.sum())

    before = kl_to_target()
    cfg = TrainConfig(budget_s=30.0, anchors_per_seq=8, seqs_per_step=2, lr=3e-2, warmup_steps=1, max_steps=25,
                      kd_weight=1.0)
    train(drafter, frozen, itertools.cycle(records), cfg, num_target_layers=TINY.num_layers)
    assert kl_to_target() < 0.7 * before


def test_distillation_needs_the_final_layer_tap_and_a_share_in_0_1():
    target = _tiny_target()
    frozen = FrozenTarget(target.embed_tokens.weight, target.lm_head.weight)
    drafter = random_drafter(TINY, num_layers=1, block_size=4, target_layer_ids=[1, 2], mask_token_id=0)
    cfg = TrainConfig(budget_s=30.0, max_steps=1, kd_weight=0.5)
    with pytest.raises(ValueError, match="final layer 3"):
        train(drafter, frozen, iter([_sequence(16, 2 * TINY.hidden_size, seed=2)]), cfg, num_target_layers=TINY.num_layers)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        TrainConfig(budget_s=30.0, kd_weight=1.5)


def test_a_run_segment_stops_early_and_a_resumed_run_finishes_the_time_box():
    target = _tiny_target()
    frozen = FrozenTarget(target.embed_tokens.weight, target.lm_head.weight)
    drafter = random_drafter(TINY, num_layers=1, block_size=4, target_layer_ids=[1, 3], mask_token_id=0)
    records = itertools.cycle([_sequence(16, 2 * TINY.hidden_size, seed=s) for s in (2, 3)])
    saved = []
    state = train(drafter, frozen, records, TrainConfig(budget_s=600.0, max_steps=5, segment_s=1e-6),
                  on_save=lambda st: saved.append(st.step))
    assert state.step == 0 and saved == [0]  # stopped at once, but checkpointed
    state = train(drafter, frozen, records, TrainConfig(budget_s=600.0, max_steps=5), state=state,
                  run_info={"data": "second"}, evaluate=lambda d: {"tau": 0.5})
    assert state.step == 5
    assert [r["step"] for r in state.runs] == [0, 0] and state.runs[1]["data"] == "second"
    assert state.runs[0]["train_config"]["segment_s"] == 1e-6 and state.runs[1]["train_config"]["segment_s"] is None
    assert [(e["step"], e["run"]) for e in state.evals] == [(0, 1), (5, 1)]  # each run starts and ends with one
