"""OpenAI-compatible HTTP front end (`cast-trtllm serve --api openai`, the `trtllm-serve`
interface) over the continuous-batching scheduler.

schemas (request bodies, validated) → app (routes; the engine request from
`runtime.serving.requests.build_request`) → service (the scheduler bridge) →
runtime.serving.scheduler; responses (full bodies, stream chunks and logprobs), text
(chat template, stop strings), errors (OpenAI error objects), metrics (Prometheus),
launch (the one engine build, uvicorn, drain on SIGTERM).
"""
