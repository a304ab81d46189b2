"""`ArmStats`: the running tokens and wall ms per round of one arm of a draft gate (drafted or AR)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ArmStats:
    """EWMA of committed tokens and wall milliseconds per round of one arm."""

    tokens: float = 0.0
    ms: float = 0.0
    rounds: int = 0

    def update(self, tokens: float, round_ms: float, alpha: float) -> None:
        if self.rounds == 0:
            self.tokens, self.ms = float(tokens), float(round_ms)
        else:
            self.tokens += alpha * (tokens - self.tokens)
            self.ms += alpha * (round_ms - self.ms)
        self.rounds += 1
