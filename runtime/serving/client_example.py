"""Query the `ensemble` model with tritonclient, exactly as a TensorRT-LLM-backend client does.

    cast-trtllm triton-repo --out /tmp/cast-repo                # HTTP / gRPC infer, generate
    cast-trtllm serve --repo /tmp/cast-repo --port 8000 --grpc-port 8001 &
    python -m runtime.serving.client_example --prompt "def fib(n):" --max-tokens 32
    # decoupled repository (triton-repo --decoupled): gRPC streaming, one response per round
    python -m runtime.serving.client_example --stream --url 127.0.0.1:8001
    # the same through Triton's generate extension
    curl -X POST localhost:8000/v2/models/ensemble/generate -d '{"text_input": "hi", "max_tokens": 16}'
"""

from __future__ import annotations

import queue

import click
import numpy as np

MODEL = "ensemble"


def build_inputs(module, prompt: str, max_tokens: int, temperature: float = 0.0, seed: int = 0,
                 stream: bool = False, **extra: np.ndarray) -> list:
    """tritonclient InferInput list for one prompt (`module` = tritonclient.http or .grpc).

    Shapes carry the batch dimension ([1, 1]), as for TensorRT-LLM's ensemble;
    `extra` adds inputs given as [1, ...] numpy arrays (e.g. method, budget, end_id).
    """
    values = {
        "text_input": np.array([[prompt.encode()]], dtype=np.object_),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float32),
        "seed": np.array([[seed]], dtype=np.uint64),
        "stream": np.array([[stream]], dtype=bool),
        **extra,
    }
    inputs = []
    for name, array in values.items():
        tensor = module.InferInput(name, list(array.shape), _datatype(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _datatype(array: np.ndarray) -> str:
    kinds = {"O": "BYTES", "b": "BOOL"}
    if array.dtype.kind in kinds:
        return kinds[array.dtype.kind]
    return {np.int32: "INT32", np.int64: "INT64", np.uint64: "UINT64", np.float32: "FP32"}[array.dtype.type]


def _summary(result) -> str:
    rate = float(result.as_numpy("acceptance_rate").reshape(-1)[0])
    accepted = int(result.as_numpy("total_accepted_draft_tokens").reshape(-1)[0])
    drafted = int(result.as_numpy("total_draft_tokens").reshape(-1)[0])
    reason = result.as_numpy("finish_reason").reshape(-1)[0].decode()
    return f"finish {reason}; accepted {accepted} of {drafted} draft tokens (acceptance rate {rate:.3f})"


@click.command()
@click.option("--url", default="127.0.0.1:8000", show_default=True, help="HTTP (or gRPC with --stream) address.")
@click.option("--model", default=MODEL, show_default=True, help="Model name in the repository.")
@click.option("--prompt", default="Write a haiku about speculative decoding.", help="Prompt text.")
@click.option("--max-tokens", type=int, default=32, show_default=True, help="New tokens to generate.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@click.option("--stream", is_flag=True, help="gRPC streaming (stream=true) against a decoupled repository.")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Client timeout in seconds.")
def main(url: str, model: str, prompt: str, max_tokens: int, temperature: float, seed: int, stream: bool,
         timeout: float) -> None:
    """Send one request; print the text and the speculative-decoding metrics."""
    if not stream:
        import tritonclient.http as http

        client = http.InferenceServerClient(url, network_timeout=timeout, connection_timeout=timeout)
        result = client.infer(model, build_inputs(http, prompt, max_tokens, temperature, seed))
        click.echo(result.as_numpy("text_output").reshape(-1)[0].decode())
        click.echo(f"-- {_summary(result)}")
        return
    import tritonclient.grpc as grpc

    responses: queue.Queue = queue.Queue()
    client = grpc.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer(model, build_inputs(grpc, prompt, max_tokens, temperature, seed, stream=True))
    while True:
        result, error = responses.get(timeout=timeout)
        if error is not None:
            raise click.ClickException(str(error))
        click.echo(result.as_numpy("text_output").reshape(-1)[0].decode(), nl=False)
        if result.as_numpy("finish_reason").reshape(-1)[0]:
            click.echo(f"\n-- {_summary(result)}")
            break
    client.stop_stream()
    client.close()


if __name__ == "__main__":
    main()
