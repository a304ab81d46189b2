"""Per-request logit processing of the target: `min_tokens`, `bad_words`, the occurrence
penalties and min_p (`cast_trtllm.penalties`), and logprobs.

Lossless decoding keeps the target's law AFTER the fixed processors (Theorem 3), so the
processors here run on the target's verify logits INSIDE the walk, before the greedy
argmax or the recursive rejection sampling, and on the prefill's last row for the first
token: every pack row sees exactly what an autoregressive step at its position would.

Row terms (a pack [b, z_1..z_N] of a request that has emitted `generated` tokens, the
pending root b among them): pack row r holds the node at tree depth d(r) (the root: 0)
and its logits choose output token number `generated + d(r)` (0-based). Its context is
the prompt, the emitted tokens and the tree path root -> r (node tokens, root excluded).

- min_tokens: the stop token ids get -inf on rows whose token number is < min_tokens
  (as vLLM's MinTokensLogitsProcessor and TensorRT-LLM's min length).
- bad_words: token sequences w_1..w_k; w_k gets -inf on a row whose context ends with
  w_1..w_{k-1} (k = 1: always), the context being prompt + output as in TensorRT-LLM.
- penalties / min_p: over the same per-row context, after the bans (`Penalties`).

Logprobs (OpenAI `logprobs` / `top_logprobs`): log_softmax of the processed row that
produced each committed token (no temperature, top-k or top-p), and its top-k entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cast_trtllm.penalties import Penalties
from cast_trtllm.tree import Tree

MAX_TOP_LOGPROBS = 20  # as OpenAI's top_logprobs


def check_bad_words(bad_words: Sequence[Sequence[int]], vocab_size: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Bad words as tuples of token ids; ValueError naming the first bad one."""
    out = tuple(tuple(int(t) for t in w) for w in bad_words)
    for w in out:
        if not w:
            raise ValueError("a bad word has no tokens: send non-empty words")
        if any(t < 0 or (vocab_size is not None and t >= vocab_size) for t in w):
            raise ValueError(f"bad word {list(w)} holds token ids outside [0, {vocab_size or 'vocab'})")
    return out


@dataclass(frozen=True, slots=True)
class LogitProcessor:
    """What one request bans (stop ids before `min_tokens` output tokens, bad words) and how
    it reweighs its rows (penalties, min_p at the request's temperature)."""

    stop_ids: tuple[int, ...]  # the ids that end this request (masked before min_tokens)
    min_tokens: int = 0
    bad_words: tuple[tuple[int, ...], ...] = ()
    penalties: Penalties | None = None
    temperature: float = 0.0  # the request's (min_p is on the temperature-scaled law)

    @staticmethod
    def of(stop_ids: Sequence[int], min_tokens: int, bad_words: Sequence[Sequence[int]],
           penalties: Penalties | None = None, temperature: float = 0.0) -> LogitProcessor | None:
        """The processor of a request, or None when it asks for nothing (then it costs nothing)."""
        if penalties is not None and not penalties.active(temperature):
            penalties = None
        proc = LogitProcessor(tuple(int(t) for t in stop_ids), int(min_tokens), check_bad_words(bad_words),
                              penalties, float(temperature))
        return proc if (proc.min_tokens > 0 and proc.stop_ids) or proc.bad_words or penalties else None

    @property
    def needs_history(self) -> bool:
        """Whether `apply` reads the prompt + output (bad words, occurrence penalties)."""
        return bool(self.bad_words) or (self.penalties is not None and self.penalties.counts_tokens)

    def apply(
        self,
        logits: torch.Tensor,  # [n, V] target logits, one row per packed token
        tree: Tree,  # the verified tree (Tree.empty() for one AR step / the prefill's last row)
        history: Sequence[int],  # prompt + emitted tokens (the pending root last, if any)
        generated: int,  # output tokens emitted so far (the pending root included)
    ) -> torch.Tensor:
        """The processed logits [n, V] (a copy where anything is banned, else `logits`)."""
        n = tree.num_packed
        if logits.dim() != 2 or logits.shape[0] != n:
            raise ValueError(f"logits must be [n={n}, V], got {tuple(logits.shape)}")
        rows: list[int] = []
        cols: list[int] = []
        if generated < self.min_tokens:
            for r in np.flatnonzero(generated + tree.pack_depth < self.min_tokens).tolist():
                rows += [r] * len(self.stop_ids)
                cols += self.stop_ids
        if self.bad_words:
            for r, ctx in enumerate(self._contexts(tree, history)):
                for w in self.bad_words:
                    if len(w) == 1 or ctx[len(ctx) - len(w) + 1:] == w[:-1]:
                        rows.append(r)
                        cols.append(w[-1])
        out = logits
        if rows:
            out = logits.clone()
            index = torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device)
            out[index] = float("-inf")
        if self.penalties is not None:
            out = self.penalties.apply(out, tree, history, self.temperature)
        return out

    def _contexts(self, tree: Tree, history: Sequence[int]) -> list[tuple[int, ...]]:
        """Per pack row: the last tokens of its context (as many as the longest bad word needs)."""
        keep = max((len(w) - 1 for w in self.bad_words), default=0)
        if keep == 0:
            return [()] * tree.num_packed
        ctx = [tuple(history[len(history) - keep:]) if len(history) >= keep else tuple(history)]
        for token, parent in zip(tree.tokens.tolist(), tree.parent.tolist()):  # parents come first
            ctx.append((ctx[parent + 1] + (token,))[-keep:])
        return ctx


def committed_rows(path: np.ndarray) -> np.ndarray:
    """[A + 1] pack rows that produced a round's committed tokens: the accepted path's
    tokens come from their parents' rows, the next root from the last accepted row."""
    return np.concatenate([[0], path]).astype(np.int64)


def token_logprobs(
    logits: torch.Tensor,  # [m, V] the (processed) rows that produced the tokens
    tokens: Sequence[int],  # [m] the committed tokens
    top: int,  # how many top entries per token (0: none)
) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """(logprob of each token, its row's top-`top` (token, logprob) pairs, best first)."""
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}")
    if logits.dim() != 2 or logits.shape[0] != len(tokens):
        raise ValueError(f"logits must be [{len(tokens)}, V], got {tuple(logits.shape)}")
    lp = torch.log_softmax(logits.to(torch.float32), dim=-1)  # [m, V]
    ids = torch.as_tensor(list(tokens), dtype=torch.int64, device=lp.device)
    chosen = lp.gather(1, ids[:, None])[:, 0].tolist()
    if top == 0:
        return chosen, [[] for _ in chosen]
    values, indices = torch.topk(lp, top, dim=-1)  # [m, top]
    return chosen, [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
