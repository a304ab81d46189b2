"""OpenAI-compatible HTTP front end (`cast-trtllm serve --api openai`, the `trtllm-serve`
interface) over the continuous-batching scheduler.

schemas (request bodies, validated) → app (routes, chat template and tokenizing; the
engine request from `runtime.serving.requests.build_request`) → service (the scheduler
bridge) → runtime.serving.scheduler; responses (full bodies, stream chunks and logprobs;
text pieces: `runtime.serving.outputs.TextStream`), errors (OpenAI error objects),
metrics (Prometheus), launch (the one engine build, uvicorn, drain on SIGTERM).
"""
