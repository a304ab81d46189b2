"""Throughput over concurrency, in process (the code path the servers run) or through
`cast-trtllm serve --api openai` with the official `openai` client (`--via openai`).

In process: the engine (`build_engine` defaults unless flags say otherwise) serves the same
request pool for every (concurrency c, method): at most c requests live at once, a queued
request joins as soon as one leaves (continuous batching; `LLMEngine.step` runs one round for
every live request). Each request is greedy with `ignore_eos`, so every run commits the same
token count. Throughput = generated tokens / wall seconds of the whole run (prefill included);
goodput = tokens after each first one / seconds inside `step` (paper App. D). `best-first:W`
is the paper's App. F baseline: one budget of W x B nodes per round shared by global
best-first mass (`runtime.engine.trees.MeanBudget`), gate off; `cast:W` is W per request.

Through the server: the same methods as per-request `cast` options, each request a streamed
completion; TTFT, inter-token latency ((last - first token) / (tokens - 1)) and request
latency percentiles, and requests lost. Methods run one after another at each concurrency,
after a warm-up run of each; with `--repeats R` every cell runs R times, the method order
rotated each time, and reports its median run (of an even count, the slower middle one).
Every output is checked against AR at c = 1 (tokens in process, text through the server).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

from cast_trtllm.sampling import SamplingParams
from perf.harness import MethodSpec
from perf.trtllm_report import RequestRecord
from runtime.engine import LLMEngine, Request
from runtime.engine.trees import MeanBudget


def serve(engine: LLMEngine, requests: list[Request], concurrency: int
          ) -> tuple[float, float, list[Any], int, list[float]]:
    """Run `requests` with at most `concurrency` live -> (wall s, s inside step, finished sequences, rounds,
    each request's finish time on the engine's clock)."""
    queue, live, rounds, stepping = deque(enumerate(requests)), {}, 0, 0.0
    out: list[Any] = [None] * len(requests)
    ends = [0.0] * len(requests)
    start = time.perf_counter()
    while queue or engine.active:
        while queue and len(engine.active) < concurrency:
            i, req = queue.popleft()
            seq = engine.add_request(req)
            live[id(seq)] = (i, seq)
            if seq.done:
                out[i], ends[i] = seq, engine.clock.now()
        began = time.perf_counter()
        for seq in engine.step():
            i = live.pop(id(seq))[0]
            out[i], ends[i] = seq, engine.clock.now()
        stepping += time.perf_counter() - began
        rounds += 1
    return time.perf_counter() - start, stepping, out, rounds, ends


def requests_for(spec: MethodSpec, prompts: Sequence[Sequence[int]], max_new: int, temperature: float = 0.0,
                 seed: int = 0) -> list[Request]:
    """One `ignore_eos` request per prompt, with the method's per-request overrides: greedy, or sampled at
    `temperature` with seed `seed` + the prompt's index."""
    def sampling(i: int) -> dict:
        return {"sampling": SamplingParams(temperature=temperature, seed=seed + i)} if temperature else {}
    return [Request(tuple(p), max_new, ignore_eos=True, **sampling(i), **spec.request_options())
            for i, p in enumerate(prompts)]


def serve_method(engine: LLMEngine, spec: MethodSpec, prompts, max_new: int, concurrency: int,
                 temperature: float = 0.0, seed: int = 0):
    """`serve` one method's requests; best-first:W runs under the shared W x B width rule."""
    width = engine.width
    if spec.method == "best-first":
        engine.width = lambda prefix: MeanBudget(spec.budget)
    try:
        return serve(engine, requests_for(spec, prompts, max_new, temperature, seed), concurrency)
    finally:
        engine.width = width


def sweep_cells(levels: Sequence[int], methods: Sequence[MethodSpec], repeats: int,
                measure: Callable[[int, MethodSpec], dict], progress: bool = True) -> list[dict]:
    """measure(c, method) -> row for every (concurrency, method), `repeats` times at each c with
    the method order rotated each time (a shared machine's drift hits every method alike).
    Each cell reports its median-throughput run (of an even count, the slower middle one),
    every run's tokens/s, and the fewest outputs equal to AR of any run."""
    runs: dict[tuple[int, str], list[dict]] = {}
    with tqdm(total=len(levels) * len(methods) * repeats, desc="concurrency x method", disable=not progress) as bar:
        for c in levels:
            for r in range(repeats):
                for m in [*methods[r % len(methods):], *methods[:r % len(methods)]]:
                    bar.set_postfix_str(f"c={c} {m.label}" + (f" run {r + 1}" if repeats > 1 else ""))
                    runs.setdefault((c, m.label), []).append(measure(c, m))
                    bar.update()
    rows = []
    for c in levels:
        for m in methods:
            cell = runs[c, m.label]
            row = dict(sorted(cell, key=lambda x: x["tokens_per_s"])[(len(cell) - 1) // 2])
            rows.append(row | {"runs_tokens_per_s": [x["tokens_per_s"] for x in cell],
                               "equal_to_ar": min(x["equal_to_ar"] for x in cell)})
    return rows


def run(engine: LLMEngine, prompts: list[list[int]], max_new: int, methods: Sequence[MethodSpec],
        levels: Sequence[int], progress: bool = True, repeats: int = 1) -> list[dict]:
    """Every (concurrency, method) cell: throughput, goodput, mean R and N, outputs equal to AR alone."""
    for m in methods:  # warm-up: graphs, caches, the cost model's first readings
        serve_method(engine, m, prompts[:2], min(max_new, 16), 2)
    reference = [s.tokens for s in serve_method(engine, MethodSpec("ar"), prompts, max_new, 1)[2]]

    def measure(c: int, m: MethodSpec) -> dict:
        wall, stepping, seqs, rounds, ends = serve_method(engine, m, prompts, max_new, c)
        tokens, lengths = sum(len(s.tokens) for s in seqs), [R for s in seqs for R in s.accept_lengths]
        return {"concurrency": c, "method": m.label, "tokens": tokens, "wall_s": wall,
                "tokens_per_s": tokens / wall, "decode_s": stepping,
                "decode_tokens_per_s": (tokens - len(seqs)) / stepping, "rounds": rounds,
                "mean_R": float(np.mean(lengths)) if lengths else None,
                "mean_N": float(np.mean([N for s in seqs for N in s.budgets])) if lengths else None,
                "requests": len(seqs), "equal_to_ar": sum(s.tokens == want for s, want in zip(seqs, reference)),
                RECORDS: [request_record(s, end) for s, end in zip(seqs, ends)]}

    return sweep_cells(levels, methods, repeats, measure, progress)


RECORDS = "_records"  # a row's per-request records (`--report_json`); bench.py takes them out of the report


def request_record(seq: Any, end: float) -> RequestRecord:
    """One finished request's timeline and rounds, as trtllm-bench's report reads them."""
    return RequestRecord(len(seq.request.prompt_ids), len(seq.tokens), seq.arrival,
                         seq.arrival + seq.timings.ttft_ms / 1e3, end, list(seq.accept_lengths), list(seq.budgets),
                         list(seq.drafted), seq.stop.max_new_tokens)


def start_server(flags: Sequence[str], max_batch: int, max_queue: int, max_tokens: int) -> tuple[subprocess.Popen, Any]:
    """`cast-trtllm serve --api openai` with the engine `flags`, on a free port -> (process, ready client)."""
    from openai import OpenAI

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", "from cast_trtllm.cli import main; main()", "serve", "--api",
                               "openai", "--port", str(port), "--max-batch", str(max_batch), "--max-queue",
                               str(max_queue), "--max-tokens-limit", str(max(512, max_tokens)), "--log-level",
                               "warning", *flags], env={**os.environ, "TQDM_DISABLE": "1"})
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
    for _ in range(1200):
        if server.poll() is not None:
            raise ValueError(f"the OpenAI server exited with status {server.returncode} before it was ready")
        try:
            client.models.list()
            return server, client
        except Exception:  # not listening yet
            time.sleep(0.5)
    server.terminate()
    raise ValueError("the OpenAI server was not ready after 10 minutes")


def cast_options(spec: MethodSpec) -> dict[str, Any]:
    """A method as the server's per-request `cast` body (its draft gate is the server's --draft-gate)."""
    if spec.method == "best-first" or spec.label == "cast:auto-ungated":
        raise ValueError(f"--via openai: {spec.label} is not a per-request option of the server; "
                         "run it in process, or start the server with --no-draft-gate and use cast:auto")
    return {"method": spec.method, **({"budget": spec.budget or "auto"} if spec.method == "cast" else {})}


def stream_one(client: Any, model: str, prompt: str | Sequence[int], max_new: int, cast: dict, chat: bool
               ) -> dict[str, Any]:
    """One streamed completion (chat for a text prompt unless `chat` is off): text and times (s), or the error."""
    args = {"model": model, "max_tokens": max_new, "temperature": 0, "stream": True,
            "extra_body": {"cast": cast, "ignore_eos": True}}
    start, stamps, pieces = time.perf_counter(), [], []
    try:
        if chat and isinstance(prompt, str):
            stream = client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **args)
            text: Callable = lambda chunk: chunk.choices[0].delta.content  # noqa: E731
        else:
            stream = client.completions.create(prompt=prompt if isinstance(prompt, str) else list(prompt), **args)
            text = lambda chunk: chunk.choices[0].text  # noqa: E731
        for chunk in stream:
            if chunk.choices and text(chunk):
                stamps.append(time.perf_counter())
                pieces.append(text(chunk))
    except Exception as err:  # counted as lost
        return {"error": f"{type(err).__name__}: {err}"}
    end = time.perf_counter()
    first = stamps[0] if stamps else end
    return {"text": "".join(pieces), "ttft_s": first - start, "latency_s": end - start,
            "itl_s": (end - first) / max(1, max_new - 1)}


def run_openai(client: Any, prompts: list, max_new: int, methods: Sequence[MethodSpec], levels: Sequence[int],
               chat: bool, progress: bool = True, repeats: int = 1) -> list[dict]:
    """Every (concurrency, method) cell through the server: tokens/s, TTFT / ITL / latency, lost, = AR."""
    model = client.models.list().data[0].id

    def pool(spec: MethodSpec, items: list, c: int) -> tuple[float, list[dict]]:
        start = time.perf_counter()
        with ThreadPoolExecutor(c) as ex:
            out = list(ex.map(lambda p: stream_one(client, model, p, max_new, cast_options(spec), chat), items))
        return time.perf_counter() - start, out

    for m in methods:  # warm-up
        pool(m, prompts[:2], 2)
    reference = [r.get("text") for r in pool(MethodSpec("ar"), prompts, 1)[1]]

    def measure(c: int, m: MethodSpec) -> dict:
        wall, out = pool(m, prompts, c)
        ok = [r for r in out if "error" not in r]
        row = {"concurrency": c, "method": m.label, "tokens": len(ok) * max_new, "wall_s": wall,
               "tokens_per_s": len(ok) * max_new / wall, "requests": len(out), "lost": len(out) - len(ok),
               "equal_to_ar": sum(r.get("text") == want for r, want in zip(out, reference))}
        for key in ("ttft", "itl", "latency"):
            ms = [1e3 * r[f"{key}_s"] for r in ok] or [float("nan")]
            row |= {f"p{q}_{key}_ms": float(np.percentile(ms, q)) for q in (50, 99)}
        return row

    return sweep_cells(levels, methods, repeats, measure, progress)
