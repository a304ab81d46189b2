"""`OnlineCostModel`: the verify cost per width bucket, learned from the rounds this machine runs.

A width profile is measured once, on one machine, at one thread count; used anywhere else it prices width
wrongly (a 1-thread CPU profile at 2 threads is about 3x too steep, so `auto` packs trees far too narrow).
This model learns the table instead:

- ell(bucket, B): ms of B requests each padded to `bucket` packed tokens: the verify and the host work after it
  that grows with the width (walk, commit, KV compaction). Every round is a reading (`observe_verify`): the
  per-request packed width ceil(n / B) falls in the smallest bucket >= it. A cell's estimate is the lower
  quartile of its last `window` readings: latency noise is one-sided (a stall adds time), so stalls, even
  several in one window, do not move it, and every cell is read the same way, which keeps them comparable.
  Readings are stored at the table's speed and answered in today's (`cast_trtllm.machine_speed`): a stretch
  where the whole machine runs slow moves the speed, not the cells read in it.
- draft_ms(B): what drafting adds to a round (the drafter call and the tree/mask host work), read the same way
  (`observe_draft`). Beyond the widest batch read (or from the prior, a B = 1 figure) it grows as the filled
  verify curve does from that batch's `draft_rows` x B rows to B's: a drafter pass is B blocks of rows on the
  same hardware, so a compute-bound CPU prices drafting 16 requests near 5x one (measured there: 61 ms against
  12 ms for two), and a flat (memory-bound) curve keeps it near flat. Held flat, a fresh engine under load
  priced its first drafted rounds at the one-request cost and drafted where AR wins (cast:auto 0.91x AR at
  c = 16, 32 GSM8K prompts).
- cells never measured are filled from the `prior` (a width profile row or a first-use probe, packed count ->
  ms at B = 1; B > 1 reads it at B x bucket packed tokens) mapped onto the measured cells by an affine fit
  a + s * prior: the prior keeps its shape (its cliffs), the live cells set level and slope. Two measured buckets
  correct an affine prior exactly, whatever its slope. Without a prior, an affine fit of the measured cells in
  packed tokens; with one cell, flat (optimistic: wider looks free until read). A cell read fewer than
  `min_readings` times is priced at most at its fill.
- exploration: every `probe_every`-th `choose`, a neighbour bucket of the chosen one with
  fewer than `min_readings` readings (or none for `refresh_rounds` rounds) is played
  instead, wider first, so a wrong prior cannot lock in a narrow tree.

`choose` is `WidthPolicy.choose`'s contract: the table rule argmax_N (B + g(N)) /
(draft_ms + ell(bucket(N))) over the learned table, a drafted round's cost including its
draft. An undrafted (AR) round costs ell(1) and commits 1 token; `draft_pays` compares
the two from the same table, and `cast_trtllm.draft_gate.DraftGate(costs=model)` asks it,
so the gate never skips a tree the width rule prices as a win. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from cast_trtllm.cost_curve import fill_curve
from cast_trtllm import cost_model_file
from cast_trtllm.json_fields import ascending_ints, milliseconds, milliseconds_list
from cast_trtllm.machine_speed import MachineSpeed
from cast_trtllm.width import (WidthChoice, best_budget, check_batch, check_masses, check_policy, drafting_of,
                               round_costs, width_choice)

DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
MIN_MS = 1e-3  # a filled cell is never cheaper than this
RATES_KEPT = 256  # best_rate answers kept between table moves


@dataclass(slots=True)
class OnlineCostModel:
    buckets: Sequence[int] = DEFAULT_BUCKETS  # packed widths per request, ascending
    prior: Mapping[int, float] | None = None  # packed count n -> verify ms at B = 1
    prior_draft_ms: float = 0.0  # draft cost until one is read
    # readings kept per cell (estimate: their lower quartile). A machine runs slow for stretches, not only a
    # round: a 2-core CPU at c = 4 read the (4, bucket 4) cell 48-50 ms, then 62-76 ms for 10 rounds in a row;
    # with 9 readings that stretch replaced the whole cell, so drafting was priced on the slow stretch against
    # an AR cell read in a fast one (0.76x AR where it won 1.08x) and the batch played AR for two runs. With
    # 32, a cell keeps its fast readings through 24 slow ones.
    window: int = 32
    min_readings: int = 3  # a cell with fewer is unknown: a neighbour probe plays it
    probe_every: int = 4  # every k-th choose may play a neighbour bucket
    refresh_rounds: int = 512  # a neighbour unread this many rounds is probed again
    rank_cap: int = 8  # K: tokens kept per drafted position (the runtime reads it)
    draft_rows: int = 16  # rows per request of one drafter block pass (L + 1)
    max_budget: int | None = None  # None: widest bucket - 1
    mass_exponent: float = 1.0  # calibration: a node's acceptance ~= rho ** exponent
    # learned state, changed only by observe_* (and choose's probe counter)
    verify: dict[int, dict[int, list[float]]] = field(default_factory=dict, init=False)  # [batch][bucket]
    draft: dict[int, list[float]] = field(default_factory=dict, init=False)  # [batch] -> ms readings
    rounds: int = field(default=0, init=False)  # verify readings so far (the `refresh_rounds` clock)
    speed: MachineSpeed = field(default_factory=MachineSpeed, init=False)  # today's ms over the stored readings'
    last_read: dict[tuple[int, int], int] = field(default_factory=dict, init=False, repr=False)
    chooses: int = field(default=0, init=False, repr=False)
    tables: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)  # verify_ms cache
    drafts: dict[int, float] = field(default_factory=dict, init=False, repr=False)  # draft_ms cache
    rates: dict[tuple, float] = field(default_factory=dict, init=False, repr=False)  # best_rate cache
    # (batch, drafting) -> the table rule's round ms per budget and its buckets (`width.round_costs`): a round
    # prices 3-5 trees on masses that change every round (gates, the shared budget, the load probe), on one table
    budget_ms: dict[tuple[int, int], tuple] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.buckets = ascending_ints(tuple(self.buckets), "OnlineCostModel.buckets")
        if self.prior is not None:
            n = ascending_ints(sorted(self.prior), "OnlineCostModel.prior packed counts")
            self.prior = dict(zip(n, milliseconds_list([self.prior[k] for k in n], "OnlineCostModel.prior",
                                                       "ms", "packed count", n)))
        milliseconds(self.prior_draft_ms, "OnlineCostModel.prior_draft_ms", positive=False)
        for name in ("window", "min_readings", "probe_every", "refresh_rounds", "draft_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"OnlineCostModel.{name} must be >= 1, got {getattr(self, name)}")
        if self.min_readings > self.window:
            raise ValueError(f"OnlineCostModel.min_readings ({self.min_readings}) cannot exceed "
                             f"window ({self.window}): a cell would never become known")
        self.max_budget = check_policy("OnlineCostModel", self.buckets, self.rank_cap, self.mass_exponent,
                                       self.max_budget)

    # -- readings --------------------------------------------------------------------------
    def observe_verify(self, packed_count: int, ms: float, batch: int = 1) -> None:
        """One verify pass: `packed_count` tokens over `batch` requests took `ms`.

        A pass wider than batch x the widest bucket is dropped (it prices no bucket)."""
        if batch < 1 or packed_count < batch:
            raise ValueError(f"a verify packs >= 1 token per request, got {packed_count} tokens for batch {batch}")
        milliseconds(ms, "observe_verify ms")
        self.rounds += 1
        slot = self._slot(-(-packed_count // batch))
        if slot < len(self.buckets):
            bucket = self.buckets[slot]
            cell = self.verify.setdefault(batch, {}).setdefault(bucket, [])
            if self._push(cell, self.speed.reading(ms, cell if len(cell) >= self.min_readings else None)):
                # every table may read this cell (a batch without cells reads all), and the draft cost
                self._moved(tables=True)  # beyond its measured batches scales as verify does
            self.last_read[(batch, bucket)] = self.rounds

    def observe_draft(self, ms: float, batch: int = 1) -> None:
        """What drafting added to one round of `batch` requests (drafter call + tree host work)."""
        check_batch(batch)
        ms = self.speed.reading(milliseconds(ms, "observe_draft ms", positive=False), None)
        if self._push(self.draft.setdefault(batch, []), ms):
            self._moved(tables=False)

    def _moved(self, tables: bool) -> None:
        """What the tables read moved: drop the caches that read it (verify tables only where `tables`)."""
        kept = (self.drafts, self.rates, self.budget_ms)  # the draft cost moved: what prices a drafted round
        for cache in (self.tables, *kept) if tables else kept:
            cache.clear()

    def _push(self, readings: list[float], ms: float) -> bool:
        """Keep the newest `window` readings; -> whether what the tables read of them moved (estimate, known)."""
        before = (typical(readings), len(readings) >= self.min_readings) if readings else None
        readings.append(float(ms))
        del readings[:-self.window]
        return (typical(readings), len(readings) >= self.min_readings) != before

    # -- the learned table -------------------------------------------------------------------
    def verify_ms(self, batch: int = 1) -> np.ndarray:
        """[buckets] ell(bucket, batch) in today's ms: measured cells, the rest filled (module docstring)."""
        return self._stored(batch) * self.speed.factor

    def _stored(self, batch: int) -> np.ndarray:
        """verify_ms at the stored readings' speed."""
        if batch not in self.tables:
            self.tables[batch] = self._table(batch)
        return self.tables[batch]

    def _table(self, batch: int) -> np.ndarray:
        row = self.verify.get(batch, {})
        own = {b: typical(v) for b, v in row.items()}
        cells = ((batch * np.array(list(own), np.float64), np.array(list(own.values()), np.float64)) if own
                 else self._all_cells())  # no cell of its own: every batch's
        filled = fill_curve(np.array(self.buckets, np.float64) * batch, *cells, self.prior)
        # a cell read fewer than min_readings times is priced no higher than the fill: one
        # stalled first reading must not hide a bucket that the other cells say is cheap
        out = [f if b not in own else own[b] if len(row[b]) >= self.min_readings else min(own[b], f)
               for b, f in zip(self.buckets, filled.tolist())]
        read = [j for j, b in enumerate(self.buckets) if len(row.get(b, ())) >= self.min_readings]
        for j, cheapest in zip(read, np.minimum.accumulate([out[j] for j in read][::-1])[::-1]):
            out[j] = float(cheapest)  # a narrow pack could run padded wider: a dearer narrow read cell is a stall
        return np.maximum(out, MIN_MS)

    def _all_cells(self) -> tuple[np.ndarray, np.ndarray]:
        """Every batch's measured cells -> (packed tokens of the pass [M], ms [M])."""
        cells = [(bb * b, typical(v)) for bb, r in self.verify.items() for b, v in r.items()]
        x_cells, y_cells = np.array(cells, np.float64).reshape(-1, 2).T
        return x_cells, y_cells

    def draft_ms(self, batch: int = 1) -> float:
        """Draft cost at `batch`: linear between measured batch sizes; below the first, flat;
        beyond the widest (or from the prior), scaled as the verify curve (module docstring)."""
        return self._stored_draft(batch) * self.speed.factor

    def _stored_draft(self, batch: int) -> float:
        check_batch(batch)
        if batch not in self.drafts:
            self.drafts[batch] = self._draft(batch)
        return self.drafts[batch]

    def _draft(self, batch: int) -> float:
        known = sorted(b for b, v in self.draft.items() if v)
        ms = [typical(self.draft[b]) for b in known]
        if known and batch <= known[-1]:
            return float(np.interp(batch, known, ms))
        base, at = (ms[-1], known[-1]) if known else (self.prior_draft_ms, 1)
        if batch == at or base == 0.0:
            return base
        rows = fill_curve(np.array([at, batch], np.float64) * self.draft_rows, *self._all_cells(), self.prior)
        return base * float(rows[1] / rows[0]) if rows[0] > 0 and rows[1] > rows[0] else base

    def round_ms(self, packed: int, batch: int = 1, drafted: bool = True) -> float:
        """Predicted ms of a round packing `packed` tokens per request (+ the draft if drafted)."""
        slot = min(self._slot(packed), len(self.buckets) - 1)
        return float(self.verify_ms(batch)[slot]) + (self.draft_ms(batch) if drafted else 0.0)

    def draft_pays(self, expected_committed: float, packed: int, batch: int = 1) -> bool:
        """Whether a drafted round committing `expected_committed` tokens at `packed` tokens per
        request beats an AR round (1 token at ell(1)), both priced by this table."""
        return expected_committed / self.round_ms(packed, batch) >= 1.0 / self.round_ms(1, batch, drafted=False)

    def best_rate(self, masses_desc: np.ndarray, batch: int = 1, drafting: int | None = None) -> float:
        """Tokens/ms of the table rule's best tree for these masses (drafted round), no exploration;
        drafting: the requests of the round that draft (None: all `batch`), whose draft pass it pays.
        Kept until the table moves: gates holding the engine's pooled masses all ask the same (c = 16
        continuous, 2-core CPU: 126 asks a run, 18 of them distinct)."""
        key = (np.asarray(masses_desc, np.float64).tobytes(), batch, drafting)
        if key not in self.rates and len(self.rates) >= RATES_KEPT:  # a table that stays put must not
            self.rates.clear()  # keep every drafted round's masses of a long-running server
        if key not in self.rates:
            self.rates[key] = self._choose(masses_desc, batch, False, drafting).predicted_tokens_per_ms
        return self.rates[key] / self.speed.factor

    def ar_rate(self, batch: int = 1) -> float:
        """Tokens/ms of an undrafted (AR) round."""
        return batch / self.round_ms(1, batch, drafted=False)

    # -- the width rule ----------------------------------------------------------------------
    def choose(self, masses_desc: np.ndarray, batch: int = 1, explore: bool = True,
               drafting: int | None = None) -> WidthChoice:
        """Budget for this drafted round (WidthPolicy.choose's contract), from the learned table.

        masses_desc: [U] descending plug-in node masses (batch > 1: pooled over the drafting
        requests), calibrated here as rho ** mass_exponent. Every `probe_every`-th call
        (with `explore`) may play a neighbour bucket instead. drafting: the requests of the B
        that draft (None: all B): the budget spreads over their packs and the draft pass is
        theirs; the verify is the B-request row (it pads every request to the widest pack)."""
        choice = self._choose(masses_desc, batch, explore, drafting)
        return choice._replace(predicted_tokens_per_ms=choice.predicted_tokens_per_ms / self.speed.factor)

    def _choose(self, masses_desc: np.ndarray, batch: int, explore: bool, drafting: int | None) -> WidthChoice:
        """`choose` at the stored readings' speed (the argmax does not depend on it)."""
        rho, spread = check_masses(masses_desc) ** self.mass_exponent, drafting_of(drafting, batch)
        ms, fixed, hi = self._stored(batch), self._stored_draft(spread), spread * self.max_budget
        if (batch, spread) not in self.budget_ms:
            self.budget_ms[batch, spread] = round_costs(self.buckets, ms, fixed, hi, spread)
        budget, bucket = best_budget(rho, *self.budget_ms[batch, spread], self.buckets, batch)
        if explore:
            self.chooses += 1
            if self.chooses % self.probe_every == 0:
                budget, bucket = self._explore(budget, bucket, batch, min(hi, len(rho)), spread)
        return width_choice(rho, budget, bucket, self.buckets, ms, fixed, batch)

    def _explore(self, budget: int, bucket: int, batch: int, hi: int, spread: int) -> tuple[int, int]:
        """A neighbour of `bucket` that needs reading, as (budget filling it, it); else unchanged."""
        j = self.buckets.index(bucket)
        for k in (j + 1, j - 1):  # wider first: narrow lock-in is the failure to undo
            if not 0 <= k < len(self.buckets):
                continue
            fill = spread * (self.buckets[k] - 1)  # the widest budget the neighbour holds
            if fill <= hi and self.needs_reading(self.buckets[k], batch):
                return fill, self.buckets[k]
        return budget, bucket

    def needs_reading(self, bucket: int, batch: int = 1) -> bool:
        """Whether cell (batch, bucket) has < `min_readings` readings or none for `refresh_rounds` rounds."""
        stale = self.rounds - self.last_read.get((batch, bucket), 0) > self.refresh_rounds
        return len(self.verify.get(batch, {}).get(bucket, [])) < self.min_readings or stale

    def _slot(self, width: int) -> int:
        return int(np.searchsorted(self.buckets, width))

    # -- persistence (`cast_trtllm.cost_model_file`) -------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """What was learned about this machine (readings, buckets, prior); not the policy knobs."""
        return cost_model_file.to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], **knobs: Any) -> OnlineCostModel:
        return cost_model_file.from_dict(cls, data, **knobs)

    def save(self, path: str | Path) -> None:
        cost_model_file.save(self, path)

    @classmethod
    def load(cls, path: str | Path, **knobs: Any) -> OnlineCostModel:
        return cost_model_file.load(cls, path, **knobs)


def typical(readings: Sequence[float]) -> float:
    """A cell's estimate: the lower quartile of its readings (the smallest of up to 4)."""
    return sorted(readings)[(len(readings) - 1) // 4]

