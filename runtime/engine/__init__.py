"""The one decoding engine (`LLMEngine`), its requests and where N is chosen."""

from runtime.engine.engine import LLMEngine
from runtime.engine.sequence import Request, Sequence

__all__ = ["LLMEngine", "Request", "Sequence"]
