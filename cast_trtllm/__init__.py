"""cast-trtllm: Cost-Aware Speculative Trees for DFlash block drafters.

This package is the engine-independent core: tree construction (`tree`), masks
(`masks`), acceptance rules (`verify`), width policy (`width`) and width profiles
(`profile`). It imports only numpy and torch; it never touches an engine or a GPU.
"""

__version__ = "0.1.0"
