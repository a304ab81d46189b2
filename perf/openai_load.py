"""Load test of `cast-trtllm serve --api openai` on the embedded model with the official
`openai` client: N requests at concurrency C per method (ar, chain, cast auto), greedy, in
the fp32 exactness configuration. Every output must equal the same prompt decoded alone
through the engine `generate` runs (method ar); reports p50/p99 latency, TTFT, tokens/s,
and requests lost, as a table, JSON and a plot.

    python -m perf.openai_load --requests 64 --concurrency 16 --max-tokens 24 \
        --out perf/results/openai_load_cpu.json
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import numpy as np

METHODS = ({"method": "ar"}, {"method": "chain"}, {"method": "cast", "budget": "auto"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(client: Any, prompt: str, max_tokens: int, cast: dict) -> dict[str, Any]:
    """A streamed chat completion: text, TTFT and latency (s), or the error."""
    start = time.perf_counter()
    first, pieces = None, []
    try:
        stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": prompt}],
                                                max_tokens=max_tokens, temperature=0, stream=True,
                                                extra_body={"cast": cast, "ignore_eos": True})
        for chunk in stream:
            delta = chunk.choices[0].delta.content if chunk.choices else None
            if delta:
                first = first or time.perf_counter()
                pieces.append(delta)
    except Exception as err:  # counted as lost
        return {"error": f"{type(err).__name__}: {err}"}
    end = time.perf_counter()
    return {"text": "".join(pieces), "ttft_s": (first or end) - start, "latency_s": end - start}


def reference(prompts: list[str], max_tokens: int, threads: int) -> list[str]:
    """Each prompt decoded alone, method ar, fp32: what `generate --method ar` prints."""
    from cast_trtllm.spec_config import SpecConfig
    from runtime.engine import Request
    from runtime.engine.build import build_engine

    built = build_engine("embedded", "none", SpecConfig(method="ar"), "cpu", "float32", threads, say=lambda _: None)
    return [built.engine.generate([Request(built.encode(p), max_tokens, ignore_eos=True)])[0].text for p in prompts]


@click.command()
@click.option("--requests", "num_requests", type=int, default=64, show_default=True)
@click.option("--concurrency", type=int, default=16, show_default=True)
@click.option("--max-tokens", type=int, default=24, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default="perf/results/openai_load_cpu.json", show_default=True)
def main(num_requests, concurrency, max_tokens, threads, out) -> None:
    """ar / chain / cast auto through the OpenAI server under load, checked against decoding alone."""
    from openai import OpenAI

    from perf.datasets import load_dataset
    from perf.report import machine_info

    prompts = [r.prompt for r in load_dataset("gsm8k", num_requests, max_tokens)]
    want = reference(prompts, max_tokens, threads)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", "from cast_trtllm.cli import main; main()", "serve", "--api", "openai", "--port", str(port),
                               "--dtype", "float32", "--threads", str(threads), "--max-batch", str(concurrency),
                               "--max-queue", str(4 * num_requests), "--log-level", "warning"],
                              env={**os.environ, "TQDM_DISABLE": "1"})
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
    rows = []
    try:
        for _ in range(600):
            try:
                client.models.list()
                break
            except Exception:
                time.sleep(0.5)
        for cast in METHODS:
            start = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(lambda p: one(client, p, max_tokens, cast), prompts))
            wall = time.perf_counter() - start
            ok = [r for r in results if "error" not in r]
            lat, ttft = [r["latency_s"] for r in ok], [r["ttft_s"] for r in ok]
            rows.append({"method": cast["method"] + (":auto" if cast.get("budget") else ""), "sent": len(prompts),
                         "answered": len(ok), "lost": len(prompts) - len(ok),
                         "equal_to_alone": sum(r["text"] == w for r, w in zip(results, want) if "error" not in r),
                         "p50_latency_s": float(np.percentile(lat, 50)), "p99_latency_s": float(np.percentile(lat, 99)),
                         "p50_ttft_s": float(np.percentile(ttft, 50)), "p99_ttft_s": float(np.percentile(ttft, 99)),
                         "tokens_per_s": len(ok) * max_tokens / wall, "wall_s": wall})
    finally:
        server.terminate()
        server.wait(60)
    report = {"rows": rows, "settings": {"requests": num_requests, "concurrency": concurrency, "max_tokens": max_tokens,
                                         "threads": threads, "dtype": "float32 (exactness configuration)",
                                         "model": "embedded", "machine": machine_info()}}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    head = "| method | sent | answered | lost | = alone | p50 / p99 latency s | p50 / p99 TTFT s | tokens/s |"
    lines = [head, "|---|---|---|---|---|---|---|---|"] + [
        f"| {r['method']} | {r['sent']} | {r['answered']} | {r['lost']} | {r['equal_to_alone']} | "
        f"{r['p50_latency_s']:.2f} / {r['p99_latency_s']:.2f} | {r['p50_ttft_s']:.2f} / {r['p99_ttft_s']:.2f} | "
        f"{r['tokens_per_s']:.1f} |" for r in rows]
    Path(out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    _plot(rows, Path(out).with_suffix(".png"))
    click.echo("\n".join(lines))


def _plot(rows: list[dict[str, Any]], out: Path) -> None:
    from perf.plots import save_figure  # first: it selects the Agg backend

    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    names = [r["method"] for r in rows]
    a.bar(names, [r["tokens_per_s"] for r in rows])
    a.set_ylabel("tokens/s (all requests)")
    b.bar(names, [r["p50_latency_s"] for r in rows], label="p50")
    b.bar(names, [r["p99_latency_s"] - r["p50_latency_s"] for r in rows], bottom=[r["p50_latency_s"] for r in rows],
          label="p99")
    b.set_ylabel("request latency s")
    b.legend()
    save_figure(fig, out)


if __name__ == "__main__":
    main()
