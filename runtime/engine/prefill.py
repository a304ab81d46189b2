"""Prefill inside the round (chunked prefill).

`add_request` only admits a request. Each round, after the decode packs are chosen, the
prompts still being prefilled take the rest of the round's token budget
(`LLMEngine.max_num_tokens`), oldest first, each as one causal chunk after its own
committed rows. A round with no decoding request prefills at least one full budget, and
one with decoding requests still advances the oldest prompt by `MIN_CHUNK` tokens, so
no prompt waits forever behind a busy batch, and a long prompt never stalls the batch
for its whole prefill.

Each chunk runs in a pass of its own after the decode pass, not inside it: the batched
forward pads every slot to its widest pack (`runtime.model.batch_graph`), so a 100-token
chunk beside 32 one-token AR packs made the pass attend 32 x 100 query rows (measured,
`python -m perf.bench throughput`, 32 GSM8K prompts: AR 119.7 / 128.6 tok/s at 16 / 32
requests in own passes, 105.1 / 92.7 fused; fusing needs a ragged attention, the varlen
kernel on CUDA). When a prompt's last chunk is in, the request samples its first token
from the chunk's last row (min_tokens / bad_words applied, logprobs kept) and decodes
from the next round; the chunks' taps wait in `pending_taps` for the drafter's next
batched context pass.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.engine.sequence import Sequence

MIN_CHUNK = 16  # prompt tokens a busy round still prefills


def take_chunks(prefilling: list[Sequence], budget: int, idle: bool) -> list[tuple[Sequence, np.ndarray]]:
    """(request, prompt ids of its next chunk) for this round, oldest request first.
    budget: tokens left in the round's pass; idle: no request decodes this round."""
    chunks: list[tuple[Sequence, np.ndarray]] = []
    for seq in prefilling:
        room = budget if chunks or (idle and budget > 0) else max(budget, MIN_CHUNK)
        ids = seq.request.prompt_ids[seq.prefilled: seq.prefilled + room]
        if room <= 0 or not ids:
            break
        chunks.append((seq, np.asarray(ids, dtype=np.int64)))
        budget -= len(ids)
    return chunks


def first_token(seq: Sequence, ids: np.ndarray, last_row: torch.Tensor, taps: torch.Tensor | None,
                now: float) -> None:
    """After a chunk's pass (its rows committed): advance the request; if its prompt is in,
    sample its first token. last_row: [1, V] the chunk's last logits row; taps: [c, F] | None."""
    seq.prefilled += len(ids)
    if taps is not None and seq.method != "ar":
        seq.pending_taps.append(taps)
    if seq.prefilling:
        return
    root = seq.sample_first(last_row.cpu())  # min_tokens / bad_words applied, logprobs kept
    seq.timings.ttft_ms = seq.timings.prefill_ms = (now - seq.arrival) * 1e3
    keep, seq.finish_reason = seq.stop.check([], [root])
    seq.tokens += [root][:keep]
    if not seq.done:
        seq.root = root
