"""The error every KV cache raises when a sequence would outgrow it (`runtime.backends.slot_pool`)."""


class CacheFullError(ValueError):
    """The sequence would outgrow the cache (the model's context window)."""
