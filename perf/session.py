"""Load the target + DFlash drafter once and hand the harness a `decode` callable.

The target is the embedded default (SmolLM2-135M-Instruct, `runtime.embedded`); the
drafter is a z-lab-format checkpoint directory. `cast:auto` builds a
`cast_trtllm.width.WidthPolicy` from a width profile at each prompt's prefix bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from cast_trtllm.profile import WidthProfile, find_measured_profile, load_profile
from cast_trtllm.sampling import SamplingParams
from cast_trtllm.width import WidthPolicy
from perf.harness import MethodSpec
from runtime.device import device_name


@dataclass(slots=True)
class DecodeSession:
    """A `runtime.decoder.Decoder` plus the settings every method shares."""

    decoder: Any                 # runtime.decoder.Decoder
    tokenizer: Any
    engine: dict[str, Any]       # report's `engine` block
    profile: WidthProfile | None = None
    rank_cap: int = 8
    chat: bool = True

    def encode(self, prompt: str) -> list[int]:
        from runtime.embedded import encode_prompt

        return encode_prompt(self.tokenizer, prompt, chat=self.chat)

    def policy(self, prompt_len: int) -> WidthPolicy:
        if self.profile is None:
            raise ValueError("cast:auto needs a width profile: pass --width-profile PATH (or width_profile "
                             "in --extra-llm-api-options), e.g. the CPU probe under perf/results/")
        return WidthPolicy.from_profile(self.profile, prompt_len, rank_cap=self.rank_cap,
                                        mass_exponent=self.decoder.drafter.drafter.config.mass_exponent)

    def __call__(self, prompt_ids: Sequence[int], spec: MethodSpec, max_new_tokens: int,
                 sampling: SamplingParams):
        """Decode one prompt: (GenerationResult, per-step TVs for a relaxed spec else None)."""
        from runtime.decoder import DecodeConfig

        auto = spec.method == "cast" and spec.budget is None
        cfg = DecodeConfig(method=spec.method, budget=spec.budget or 1,
                           width_policy=self.policy(len(prompt_ids)) if auto else None,
                           rank_cap=self.rank_cap, max_new_tokens=max_new_tokens, sampling=sampling,
                           draft_gate=spec.draft_gate)
        if spec.relaxed is None:
            return self.decoder.generate(prompt_ids, cfg), None
        from perf.relaxed_eval import RelaxedDecoder, step_tvs

        if not isinstance(self.decoder, RelaxedDecoder):
            raise ValueError("relaxed rules need a session loaded with decoder_cls=RelaxedDecoder")
        if sampling.greedy:
            raise ValueError("relaxed rules are sampling rules: pass --temperature > 0")
        self.decoder.rule, self.decoder.rounds = spec.relaxed, []
        try:
            result = self.decoder.generate(prompt_ids, cfg)
        finally:
            self.decoder.rule = None
        tvs = step_tvs(spec.relaxed, self.decoder.rounds, sampling)
        self.decoder.rounds = []
        return result, tvs


def load_session(drafter_dir: str | Path, width_profile: str | Path | None = None, rank_cap: int = 8,
                 max_draft_len: int | None = None, ignore_eos: bool = False, chat: bool = True,
                 decoder_cls: type | None = None) -> DecodeSession:
    """Embedded target + the drafter at `drafter_dir` on CPU, fp32.

    `max_draft_len` (from a speculative_config) must match the drafter's block positions L.
    `decoder_cls` substitutes a `Decoder` subclass (the relaxed-rule harness uses one).
    """
    import torch

    from runtime.decoder import Decoder
    from runtime.drafter import DrafterExecutor, load_drafter
    from runtime.embedded import load_embedded
    from runtime.target import TargetExecutor

    loaded = load_embedded("cpu", torch.float32)
    drafter = load_drafter(drafter_dir, loaded.model.config)
    draft = DrafterExecutor(drafter, loaded.model)
    if max_draft_len is not None and max_draft_len != draft.num_draft_positions:
        raise ValueError(f"speculative_config.max_draft_len: {max_draft_len} does not match the drafter at "
                         f"{drafter_dir}, which drafts L = {draft.num_draft_positions} positions")
    target = TargetExecutor(loaded.model, draft.tap_layer_ids)
    cls = decoder_cls or Decoder
    decoder = cls(target, draft, loaded.tokenizer, () if ignore_eos else loaded.eos_token_ids)
    if width_profile is None:  # the probe-measured profile shipped for this target, if any
        width_profile = find_measured_profile(loaded.name, "float32", "cpu", device_name(torch.device("cpu")))
    profile = load_profile(width_profile) if width_profile is not None else None
    engine = {"backend": "cast-trtllm torch executor", "model": loaded.name, "dtype": "float32",
              "device": "cpu", "drafter": str(drafter_dir), "block_positions_L": draft.num_draft_positions,
              "rank_cap_K": rank_cap, "width_profile": None if width_profile is None else str(width_profile),
              "ignore_eos": ignore_eos, "chat_template": chat}
    return DecodeSession(decoder, loaded.tokenizer, engine, profile, rank_cap, chat)
