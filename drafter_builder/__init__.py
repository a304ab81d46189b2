"""Builds the draft model: trains, calibrates and scores the DFlash head the runtime serves.

Owns the whole training side of the drafter: the prompt pools and their licences
(`prompts`, `stubs`), the target's greedy data in shards (`shards`), the block training
loop and its losses (`blocks`, `train`), offline greedy replay for acceptance
reports and the mass calibration (`replay`), the shipped head's recipe as data
(`recipe.json`, `recipe`) and the `cast-trtllm train-drafter` commands (`cli/`).
It is apart from `runtime/` as `engine_builder/` is: serving loads the checkpoint it
writes (`runtime.drafter`) and never imports this package, so a server ships no dataset
parsing, standard-library stub mining or optimizer code. It may import `runtime`.
"""
