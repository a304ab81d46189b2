"""DFlash block drafter: checkpoint format, model, and per-sequence executor."""

from runtime.drafter.checkpoint import default_target_layer_ids, load_drafter, random_drafter, save_drafter
from runtime.drafter.config import DrafterConfig
from runtime.drafter.executor import DrafterExecutor
from runtime.drafter.model import DFlashDrafter

__all__ = [
    "DFlashDrafter",
    "DrafterConfig",
    "DrafterExecutor",
    "default_target_layer_ids",
    "load_drafter",
    "random_drafter",
    "save_drafter",
]
