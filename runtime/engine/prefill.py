"""Prefill inside the round: prompt chunks ride the round's one pass (chunked prefill).

`add_request` only admits a request. Each round, after the decode packs are chosen, the
prompts still being prefilled take the rest of the round's token budget
(`LLMEngine.max_num_tokens`), oldest first, each as one causal chunk after its own
committed rows. A round with no decoding request prefills at least one full budget, and
one with decoding requests still advances the oldest prompt by `MIN_CHUNK` tokens, so
no prompt waits forever behind a busy batch. When a prompt's last chunk is in, the
request samples its first token from the chunk's last row (min_tokens / bad_words
applied, logprobs kept) and decodes from the next round; the chunks' taps wait in
`pending_taps` for the drafter's next batched context pass.
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


def first_tokens(chunks: list[tuple[Sequence, np.ndarray]], last_rows: torch.Tensor, taps: torch.Tensor | None,
                 now: float) -> None:
    """After the pass: advance each chunk's request; one whose prompt is in samples its first
    token. last_rows: [len(chunks), V] each chunk's last logits row; taps: [Σc, F] | None."""
    start = 0
    for j, (seq, ids) in enumerate(chunks):
        seq.prefilled += len(ids)
        if taps is not None and seq.method != "ar":
            seq.pending_taps.append(taps[start: start + len(ids)])
        start += len(ids)
        if seq.prefilling:
            continue
        root = seq.sample_first(last_rows[j: j + 1].cpu())  # min_tokens / bad_words applied, logprobs kept
        seq.timings.ttft_ms = seq.timings.prefill_ms = (now - seq.arrival) * 1e3
        keep, seq.finish_reason = seq.stop.check([], [root])
        seq.tokens += [root][:keep]
        if not seq.done:
            seq.root = root
