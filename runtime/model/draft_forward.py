"""The drafter's part of a round as ONE static-shape function of its buffers (issue 37).

`draft_round(context, block, pool, meta, taps, mask_token, positions, k, draft_ids)`:
  meta [B, 4] int64 per request: slot, C (its committed context rows), m (new rows staged in
       `taps` this round, <= R), the pending root;
  taps [B, R, F] the target taps of each request's newly committed positions, rows >= m unused
  -> the context pass over every staged row (`ContextGraph`), the kept rows scattered into the
     drafter's feature pool in place (a fixed-size scatter; rows >= m go to the trash column),
     the block pass [root, mask, ...] at positions C + m + j over each request's context
     (`BatchDraftGraph`, context mask built on the device), and each position's top k:
     ids [B, positions, k] (target ids), log-probs [B, positions, k], logits [B, L, Vd].
No host read, no data-dependent shape: traced whole by `torch._dynamo`, captured per batch
bucket on CUDA (`runtime.engine.draft_runner`).
"""

from __future__ import annotations

import torch

from runtime.model.graphs import MASKED


def draft_round(context, block, pool, meta: torch.Tensor, taps: torch.Tensor, mask_token: int, positions: int,
                k: int, draft_ids: torch.Tensor | None):
    slot, length, new, root = meta.unbind(1)
    B, R, F = taps.shape
    rows = torch.arange(R, device=meta.device)
    at = length[:, None] + rows[None, :]  # [B, R] each staged row's context position
    keys, values = context(taps.reshape(B * R, F), at.reshape(-1))  # [B*R, layers, Hkv, d]
    columns = torch.where(rows[None, :] < new[:, None], at, pool.trash)
    pool.scatter(slot[:, None].expand(B, R).reshape(-1), columns.reshape(-1), keys, values)
    length = length + new
    size = block.drafter.config.block_size
    block_ids = torch.cat([root[:, None], torch.full((B, size - 1), mask_token, dtype=root.dtype,
                                                      device=root.device)], 1)
    place = length[:, None] + torch.arange(size, device=meta.device)[None, :]
    columns = torch.arange(pool.keys.shape[3], device=meta.device)
    floor = max(MASKED, torch.finfo(pool.dtype).min)
    mask = torch.where(columns[None, :] < length[:, None], 0.0, floor).to(pool.dtype)  # [B, C + 1]
    logits = block(block_ids, place, slot, mask, *pool.keys.unbind(0), *pool.values.unbind(0))  # [B, L, Vd]
    logprobs = torch.log_softmax(logits[:, :positions].float(), dim=-1)
    lp, ids = torch.topk(logprobs, k, dim=-1, sorted=True)
    if draft_ids is not None:
        ids = draft_ids[ids]
    return ids, lp, logits
