"""cast-trtllm: Cost-Aware Speculative Trees for DFlash block drafters.

This package is the engine-independent core: trees (`tree`, searched by `best_first`),
masks (`masks`), acceptance rules (`verify`, `sampling`, lossy `relaxed`), and the width:
the measured cost curve (`cost_curve`), width profiles (`profile`), the width rules and
the profile policy (`width`), the online-learned cost table (`cost_model`)
and the draft gate (`draft_gate`). It imports only numpy and torch; it never touches an
engine or a GPU.
"""

__version__ = "0.1.0"
