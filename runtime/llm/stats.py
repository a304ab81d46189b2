"""Per-iteration statistics in TensorRT-LLM's shape (`LLM.get_stats`: its executor's
IterationStats as dicts), one per engine round.

specDecodingStats, over the requests that drafted this round:
  numDraftTokens              tree nodes verified (a chain: its L tokens, fewer where max_tokens
                              leaves less room; TensorRT-LLM counts a tree's nodes too)
  numAcceptedTokens           draft tokens accepted (committed - 1 per drafting request)
  numRequestsWithDraftTokens  requests that drafted
  acceptanceLength            (accepted + requests) / requests: committed tokens per drafted round
  iterLatencyMS               the round's wall time
  draftOverhead               the share of it spent drafting (drafter passes and their context)
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

MAX_KEPT = 1000  # iterations kept between get_stats calls (TensorRT-LLM keeps a bounded queue too)


class IterationStats:
    """Fed by the scheduler after every round (`on_round`); read by `LLM.get_stats`."""

    def __init__(self, queued=lambda: 0) -> None:
        self._seen: dict[int, tuple[int, float]] = {}  # id(seq) -> (rounds seen, draft ms seen)
        self._kept: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_KEPT)
        self._cv = threading.Condition()
        self._iter = 0
        self._queued = queued

    def on_round(self, seqs: list, ms: float) -> None:
        drafts = accepted = with_drafts = decoded = decoding = 0
        draft_ms = 0.0
        for seq in seqs:
            rounds, drafted_ms = self._seen.get(id(seq), (0, 0.0))
            now_ms = seq.timings.draft_ms + seq.timings.first_draft_ms
            for n, a, d in zip(seq.budgets[rounds:], seq.accept_lengths[rounds:], seq.drafted[rounds:]):
                decoding += 1
                decoded += a
                if d:
                    drafts, accepted, with_drafts = drafts + n, accepted + a - 1, with_drafts + 1
            draft_ms = max(draft_ms, now_ms - drafted_ms)  # every drafting request books the round's draft time
            if seq.done:
                self._seen.pop(id(seq), None)
            else:
                self._seen[id(seq)] = (len(seq.accept_lengths), now_ms)
        spec = {"numDraftTokens": drafts, "numAcceptedTokens": accepted, "numRequestsWithDraftTokens": with_drafts,
                "acceptanceLength": (accepted + with_drafts) / with_drafts if with_drafts else 0.0,
                "iterLatencyMS": ms, "draftOverhead": min(draft_ms / ms, 1.0) if ms > 0 else 0.0}
        with self._cv:
            self._iter += 1
            self._kept.append({
                "iter": self._iter, "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"), "iterLatencyMS": ms,
                "numActiveRequests": len(seqs), "maxNumActiveRequests": len(seqs),
                "numCompletedRequests": sum(s.done for s in seqs), "numQueuedRequests": self._queued(),
                "inflightBatchingStats": {
                    "numContextRequests": sum(s.prefilling for s in seqs), "numGenRequests": decoding,
                    "numScheduledRequests": len(seqs),
                    "avgNumDecodedTokensPerIter": decoded / decoding if decoding else 0.0},
                "specDecodingStats": spec,
            })
            self._cv.notify_all()

    def take(self, timeout: float) -> list[dict[str, Any]]:
        """Every iteration since the last call; waits up to `timeout` s for one if there is none."""
        with self._cv:
            if not self._kept and timeout > 0:
                self._cv.wait(timeout)
            out = list(self._kept)
            self._kept.clear()
        return out
