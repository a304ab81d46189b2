"""Query the `cast` model with tritonclient (HTTP, or gRPC streaming for decoupled repos).

    cast-trtllm triton-repo --out /tmp/cast-repo --model random
    cast-trtllm serve --repo /tmp/cast-repo --http-port 8000 --grpc-port 8001 &
    python -m runtime.serving.client_example --prompt "def fib(n):" --max-tokens 32
    # decoupled repo (triton-repo --decoupled):
    python -m runtime.serving.client_example --stream --url 127.0.0.1:8001
"""

from __future__ import annotations

import queue

import click
import numpy as np


def build_inputs(module, prompt: str, max_tokens: int, temperature: float, seed: int,
                 method: str = "cast", budget: str = "auto") -> list:
    """tritonclient InferInput list for one request (`module` = tritonclient.http or .grpc)."""
    values = {
        "text_input": (np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        "max_tokens": (np.array([max_tokens], dtype=np.int32), "INT32"),
        "temperature": (np.array([temperature], dtype=np.float32), "FP32"),
        "seed": (np.array([seed], dtype=np.uint64), "UINT64"),
        "method": (np.array([method.encode()], dtype=np.object_), "BYTES"),
        "budget": (np.array([budget.encode()], dtype=np.object_), "BYTES"),
    }
    inputs = []
    for name, (array, dtype) in values.items():
        tensor = module.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


@click.command()
@click.option("--url", default="127.0.0.1:8000", show_default=True, help="HTTP (or gRPC with --stream) address.")
@click.option("--prompt", default="Write a haiku about speculative decoding.", help="Prompt text.")
@click.option("--max-tokens", type=int, default=32, show_default=True, help="New tokens to generate.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@click.option("--stream", is_flag=True, help="gRPC streaming against a decoupled repository.")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Client timeout in seconds.")
def main(url: str, prompt: str, max_tokens: int, temperature: float, seed: int, stream: bool, timeout: float) -> None:
    """Send one request and print the text, committed round lengths and finish reason."""
    if not stream:
        import tritonclient.http as http

        client = http.InferenceServerClient(url, network_timeout=timeout, connection_timeout=timeout)
        result = client.infer("cast", build_inputs(http, prompt, max_tokens, temperature, seed))
        text = result.as_numpy("text_output")[0].decode()
        rounds = result.as_numpy("accept_lengths").tolist()
        click.echo(f"{text}\n-- rounds {len(rounds)}, accept lengths {rounds}, "
                   f"finish {result.as_numpy('finish_reason')[0].decode()}")
        return
    import tritonclient.grpc as grpc

    responses: queue.Queue = queue.Queue()
    client = grpc.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("cast", build_inputs(grpc, prompt, max_tokens, temperature, seed))
    while True:
        result, error = responses.get(timeout=timeout)
        if error is not None:
            raise click.ClickException(str(error))
        click.echo(result.as_numpy("text_output")[0].decode(), nl=False)
        reason = result.as_numpy("finish_reason")[0].decode()
        if reason:
            click.echo(f"\n-- finish {reason}")
            break
    client.stop_stream()


if __name__ == "__main__":
    main()
