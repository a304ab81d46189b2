"""Outside peers as rows of the same run, on the same target weights and prompts.

- `hf`: Hugging Face transformers `generate`, greedy AR, on the target's HF model in fp32
  (what `runtime.loader.load_hf_checkpoint` reads; our forward shares these weights).
- `dflash`: z-lab's reference implementation (PyPI `dflash==0.1.0`, optional: extra
  `peers`), its own chain speculative decoding `dflash.model.dflash_generate`, with the
  same HF target and the drafter head `build_engine` loads by default. Three adaptations,
  none of which changes its algorithm: (1) its timer calls `torch.cuda.synchronize()`, so
  on a CPU `_cuda_time` is replaced by `time.perf_counter`; (2) the shipped head scores a
  reduced draft vocabulary (`d2t`, `runtime.drafter.vocab`), which z-lab's `compute_logits`
  (full target lm_head) does not know, so the head's own `DraftHead` is swapped in (-inf
  outside the draft vocabulary, exactly what our drafter scores); (3) stop tokens are
  None when the run ignores EOS, as every method here does then.

Each peer returns a `runtime.result.GenerationResult` timed like ours (paper App. D):
decode window from the first token to the last, over every new token. HF `generate`'s
first token is stamped by a streamer; dflash's decode window is its own `return_stats`
window, which also holds its first draft (ours excludes it: 1 of ~128 tokens' rounds).
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from perf.report import package_version
from runtime.loader import eos_token_ids
from runtime.result import GenerationResult, Timings

PEERS = ("hf", "dflash")


class PeerUnavailable(RuntimeError):
    """A peer that cannot run here, with the reason (a documented gap, not a number)."""


def import_dflash() -> Any:
    """`dflash.model` (z-lab 0.1.0): installed, or unpacked at $DFLASH_SRC."""
    if os.environ.get("DFLASH_SRC") and os.environ["DFLASH_SRC"] not in sys.path:
        sys.path.insert(0, os.environ["DFLASH_SRC"])
    try:
        import dflash.model as reference
    except ImportError as err:
        raise PeerUnavailable(f"z-lab dflash is not importable ({err}); pip install --no-deps dflash==0.1.0 "
                              "(extra `peers`) or set DFLASH_SRC to the folder holding dflash/") from None
    return reference


class _FirstToken:
    """A `generate` streamer that stamps when the first new token arrives (after the prompt)."""

    def __init__(self) -> None:
        self.calls, self.first = 0, None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:  # the first put is the prompt itself
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


class Peers:
    """Loads the peers' models once (lazily) and decodes one prompt per call (in this process;
    `PeerProcess` runs one in a process of its own)."""

    def __init__(self, target: str, drafter_dir: str | None, ignore_eos: bool = True) -> None:
        """target: what `--target` resolved to (`LoadedModels.source`); drafter_dir: the head's directory."""
        self.target, self.drafter, self.ignore_eos = target, drafter_dir, ignore_eos
        self._hf: Any = None
        self._dflash: Any = None

    @property
    def hf(self) -> Any:
        """The target's HF model and tokenizer, fp32 on the CPU (runtime.loader)."""
        if self._hf is None:
            from runtime.loader import load_hf_checkpoint

            self._hf = load_hf_checkpoint(self.target, "cpu", "float32")
            if self.ignore_eos:  # `generate` fills an unset eos from the model's own config: unset it there
                self._hf.model.generation_config.eos_token_id = None
        return self._hf

    def __call__(self, name: str, prompt_ids: Sequence[int], max_new_tokens: int) -> GenerationResult:
        if name == "hf":
            return self._hf_generate(prompt_ids, max_new_tokens)
        if name == "dflash":
            return self._dflash_generate(prompt_ids, max_new_tokens)
        raise ValueError(f"unknown peer {name!r}; peers: {PEERS}")

    def _hf_generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> GenerationResult:
        model, tokenizer = self.hf.model, self.hf.tokenizer
        config = copy.deepcopy(model.generation_config)
        config.do_sample, config.max_new_tokens, config.min_new_tokens = False, max_new_tokens, None
        config.temperature = config.top_p = config.top_k = None
        config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        config.eos_token_id = None if self.ignore_eos else list(eos_token_ids(model, tokenizer))  # the engine's set
        ids = torch.tensor([list(prompt_ids)])
        streamer = _FirstToken()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                 streamer=streamer)
        end = time.perf_counter()
        tokens = out[0, ids.shape[1]:].tolist()
        first = streamer.first or end
        timings = Timings(ttft_ms=1e3 * (first - start), prefill_ms=1e3 * (first - start),
                          decode_ms=1e3 * (end - first))
        return _result("hf", tokens, len(prompt_ids), max_new_tokens, [1] * max(0, len(tokens) - 1), timings)

    def _load_dflash(self) -> Any:
        if self._dflash is None:
            reference = import_dflash()
            from safetensors.torch import load_file

            from runtime.drafter.vocab import D2T_KEY, DraftHead

            if self.drafter is None:
                raise PeerUnavailable("dflash needs a drafter head; this run has --drafter none")
            head = reference.DFlashDraftModel.from_pretrained(self.drafter, dtype=torch.float32).eval()
            d2t = load_file(str(Path(self.drafter) / "model.safetensors")).get(D2T_KEY)
            ours = DraftHead(self.hf.model.lm_head.weight, d2t)
            head.compute_logits = lambda hidden, output_head: ours(hidden)  # (2) in the module doc
            if not torch.cuda.is_available():
                reference._cuda_time = time.perf_counter  # (1): its timer synchronizes CUDA
            self._dflash = (reference, head)
        return self._dflash

    def _dflash_generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> GenerationResult:
        reference, head = self._load_dflash()
        stop = None if self.ignore_eos else list(eos_token_ids(self.hf.model, self.hf.tokenizer))
        stats = reference.dflash_generate(head, self.hf.model, torch.tensor([list(prompt_ids)]), max_new_tokens,
                                          stop, return_stats=True)
        tokens = stats.output_ids[0, len(prompt_ids):].tolist()
        decode_ms = 1e3 * stats.time_per_output_token * stats.num_output_tokens
        timings = Timings(ttft_ms=1e3 * stats.time_to_first_token, prefill_ms=1e3 * stats.time_to_first_token,
                          decode_ms=decode_ms)
        rounds = list(stats.acceptance_lengths)
        return _result("dflash", tokens, len(prompt_ids), max_new_tokens, rounds, timings, head.block_size - 1)


def _serve(conn: Any, target: str, drafter_dir: str | None, ignore_eos: bool, threads: int) -> None:
    """The peer process: decode each (name, prompt ids, max new tokens) it is sent; reply (ok, result | error)."""
    torch.set_num_threads(threads)
    peers = Peers(target, drafter_dir, ignore_eos)
    try:
        while (job := conn.recv()) is not None:
            try:
                conn.send((True, peers(*job)))
            except (PeerUnavailable, ValueError) as err:
                conn.send((False, (type(err).__name__, str(err))))
    except (EOFError, BrokenPipeError):  # the benchmark process is gone
        pass
    conn.close()


class PeerProcess:
    """The peers in a process of their own, at `threads` torch threads, called like `Peers`.

    A process of their own is how a user runs them, and keeps their torch thread setting
    apart from the engine's. On this project's shared 2-core CPU, torch at 2 threads ran
    them 4-15x slower than at 1 whenever the other engineers' tests held a core (OpenMP
    threads wait on each other), so `perf.bench latency --peer-threads` defaults to 1.
    Calls block: the run stays interleaved, one method at a time.
    """

    def __init__(self, target: str, drafter_dir: str | None, ignore_eos: bool = True, threads: int = 1) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, target, drafter_dir, ignore_eos, threads), daemon=True)
        self._process.start()
        self.threads, self.drafter = threads, drafter_dir

    def describe(self) -> dict[str, str]:
        """What each peer runs, for the report."""
        own = f"; own process, {self.threads} torch thread(s)"
        return {"hf": f"transformers {package_version('transformers')} generate, greedy, fp32, same weights{own}",
                "dflash": f"z-lab dflash {package_version('dflash') or '(not installed)'} dflash_generate (chain), "
                          f"fp32 target, drafter {self.drafter}; CPU timer and draft-vocabulary head (perf/peers.py "
                          f"module doc){own}"}

    def __call__(self, name: str, prompt_ids: Sequence[int], max_new_tokens: int) -> GenerationResult:
        self._conn.send((name, list(prompt_ids), max_new_tokens))
        ok, value = self._conn.recv()
        if ok:
            return value
        kind, message = value
        raise PeerUnavailable(message) if kind == "PeerUnavailable" else ValueError(message)

    def close(self) -> None:
        if self._process.is_alive():
            self._conn.send(None)
            self._process.join(timeout=30)


def _result(method: str, tokens: list[int], prompt_tokens: int, max_new_tokens: int, rounds: list[int],
            timings: Timings, drafted: int = 0) -> GenerationResult:
    """A peer's tokens and timer as our result; its decode time is not split into draft / verify."""
    return GenerationResult(method, "", tokens, "length" if len(tokens) >= max_new_tokens else "eos", prompt_tokens,
                            accept_lengths=rounds, budgets=[drafted] * len(rounds), drafted=[drafted > 0] * len(rounds),
                            timings=timings)
