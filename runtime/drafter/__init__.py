"""DFlash block drafter: checkpoint format, model, and per-sequence executor."""

from pathlib import Path

from runtime.drafter.checkpoint import load_drafter, random_drafter, save_drafter, with_draft_vocab, with_layers
from runtime.drafter.config import DrafterConfig
from runtime.drafter.executor import DrafterExecutor
from runtime.drafter.model import DFlashDrafter

# the trained head shipped for the embedded target (see its README.md)
DEFAULT_DRAFTER = Path(__file__).parent / "default"

__all__ = ["DEFAULT_DRAFTER", "DFlashDrafter", "DrafterConfig", "DrafterExecutor", "load_drafter", "random_drafter",
           "save_drafter", "with_draft_vocab", "with_layers"]
