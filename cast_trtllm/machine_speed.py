"""`MachineSpeed`: how fast the machine runs now, against the cost table's own cells.

A machine runs slow for stretches (another process, memory traffic, a throttled clock): on a 2-core CPU the
verify of one cell read 48-50 ms, then 62-76 ms for 10 rounds in a row, and whole 3-4 s runs moved 10-15%.
A table whose cells hold raw milliseconds then compares cells read in different stretches as if they had
been read side by side. Where one arm runs alone for a while (a batch playing AR, or, in the never_slower
benchmark, each method for a whole run) its cells hold that stretch's readings and the other arm's another's:
at c = 4 the table priced a drafted round at 2.3x an AR round where side by side it ran 1.9-2.0x, and
cast:auto played AR for a whole run where cast:3 won 1.12x AR.

So `OnlineCostModel` stores each reading divided by the speed at that moment, and answers in today's ms (its
cells times the speed). The speed is the median, over the last `window` readings of cells already known, of
reading / that cell's median: a stretch where the whole machine runs slow moves the speed, not the cells, and
a cell's level against the others is learned from readings taken close in time (a round that drafts and one
that does not, a few rounds apart). The price: a cell read alone for long cannot move against the others
(what it reads is taken for the machine's speed) until the others are read again. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median


@dataclass(slots=True)
class MachineSpeed:
    window: int = 9  # readings the speed is the median of: a stall of a round or two does not move it
    factor: float = 1.0  # today's ms over the table's (1: as the table was read)
    _ratios: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"MachineSpeed.window must be >= 1, got {self.window}")

    def reading(self, ms: float, cell: list[float] | None) -> float:
        """One reading of `ms` -> what the table stores (ms at the table's speed). cell: the known cell's stored
        readings, whose median the reading is compared with to follow the speed (None: a cell not yet known,
        stored at the speed the others set)."""
        stored = ms / self.factor
        if cell:
            self._ratios.append(ms / median(cell))
            del self._ratios[:-self.window]
            self.factor = median(self._ratios)
        return stored
