"""Routes of the OpenAI-compatible server (the `trtllm-serve` interface).

POST /v1/completions, POST /v1/chat/completions (both with `stream: true` as server-sent
events ending in `data: [DONE]`), GET /v1/models, GET /health, GET /metrics, GET /version.
A request is validated (400 naming the field), tokenized, submitted to the scheduler
(429 queue full, 503 shutting down) and answered from its `Generation`; a client that
disconnects is cancelled, which frees its batch slot before the next round.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette import EventSourceResponse

from runtime.engine import Request as EngineRequest
from runtime.serving.openai.errors import APIError, install_handlers
from runtime.serving.openai.metrics import RequestCounter
from runtime.serving.openai.responses import LogprobStream, ResponseFormat
from runtime.serving.openai.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest
from runtime.serving.openai.service import Generation, Service, Update
from runtime.serving.outputs import TextStream
from cast_trtllm.sampling_params import SamplingParams
from runtime.llm.requests import engine_request, tokenize
from runtime.serving.requests import RequestError, check_max_tokens

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there
MAX_CHARS_PER_TOKEN = 32  # prompts longer than this × the context window are refused before tokenizing
CLIENT_GONE = 499  # status recorded for a client that disconnected (nginx's convention)


def create_app(service: Service) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.scheduler.start()
        yield
        await asyncio.to_thread(service.close)

    app = FastAPI(title="cast-trtllm (OpenAI-compatible)", lifespan=lifespan)
    app.add_middleware(RequestCounter, metrics=service.metrics)
    install_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        if service.draining:
            raise APIError(503, "server shutting down", code="shutting_down")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> dict:
        from cast_trtllm import __version__

        return {"version": __version__}

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": service.model_name, "object": "model", "created": service.created, "owned_by": "cast-trtllm"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        _check(service, body)
        prompt = body.single_prompt()
        if isinstance(prompt, str):
            ids = _tokenize(service, prompt, add_special_tokens=True)
        else:
            vocab = service.engine.target.config.vocab_size
            if any(not 0 <= t < vocab for t in prompt):
                raise RequestError(f"prompt holds token ids outside [0, {vocab})", "prompt")
            ids = list(prompt)
        return await _serve(service, body, ids, f"cmpl-{uuid.uuid4().hex}", request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        _check(service, body)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        if not any(m["content"].strip() for m in messages):
            raise RequestError("messages hold no text: send at least one non-empty message", "messages")
        text = render_chat(service.tokenizer, messages, body.chat_template_kwargs)
        ids = _tokenize(service, text, add_special_tokens=False)
        return await _serve(service, body, ids, f"chatcmpl-{uuid.uuid4().hex}", request, chat=True)

    return app


def render_chat(tokenizer: Any, messages: list[dict[str, str]], template_kwargs: dict | None = None) -> str:
    """The prompt text of a conversation, ending where the assistant's turn begins.

    Uses the tokenizer's chat template, with `template_kwargs` (the request's
    chat_template_kwargs, e.g. Qwen3's enable_thinking) as its variables; a tokenizer without
    one (a base model's) gets a plain `role: content` transcript.
    """
    if getattr(tokenizer, "chat_template", None):
        kwargs = {**(template_kwargs or {}), "tokenize": False, "add_generation_prompt": True}
        return tokenizer.apply_chat_template(messages, **kwargs)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def _check(service: Service, body: GenerationRequest) -> None:
    problem = body.unsupported()
    if problem is not None:
        raise RequestError(problem[1], problem[0], "unsupported_parameter")
    if body.model != service.model_name:
        raise APIError(404, f"The model `{body.model}` does not exist; this server serves `{service.model_name}`",
                       "model", "model_not_found")


def _tokenize(service: Service, text: str, add_special_tokens: bool) -> list[int]:
    if not text.strip():
        raise RequestError("the prompt is empty: send a non-empty prompt", "prompt")
    if len(text) > MAX_CHARS_PER_TOKEN * service.context_window:
        raise RequestError(f"the prompt ({len(text)} characters) is far longer than the context window of "
                           f"{service.context_window} tokens", "prompt", "context_length_exceeded")
    return tokenize(service.tokenizer, text, add_special_tokens)


def _engine_request(service: Service, body: GenerationRequest, ids: list[int], request_id: str) -> EngineRequest:
    """The engine request of a validated body and its prompt ids; RequestError naming a bad field."""
    if not ids:
        raise RequestError("the prompt is empty: send a non-empty prompt", "prompt")
    max_tokens = check_max_tokens(body.requested_max_tokens(), len(ids), service.cfg, service.context_window)
    if body.min_tokens > max_tokens:
        raise RequestError(f"min_tokens={body.min_tokens} is over max_tokens={max_tokens}", "min_tokens")
    vocab, stop_ids = service.engine.target.config.vocab_size, tuple(body.stop_token_ids or ())
    if any(t >= vocab for t in stop_ids):
        raise RequestError(f"stop_token_ids holds ids outside [0, {vocab})", "stop_token_ids")
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                top_k=max(body.top_k, 0) or None, seed=body.seed, stop=list(body.stop_strings()) or None,
                                min_tokens=body.min_tokens, stop_token_ids=list(stop_ids) or None,
                                bad=body.bad_words or None, ignore_eos=body.ignore_eos,
                                logprobs=body.top_logprobs_asked(), repetition_penalty=body.repetition_penalty,
                                presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                                min_p=body.min_p)
        return engine_request(params, ids, service.tokenizer, request_id, body.cast.method, body.cast.budget)
    except ValueError as err:
        raise RequestError(str(err)) from err


async def _serve(service: Service, body: GenerationRequest, ids: list[int], request_id: str, request: Request,
                 chat: bool) -> Response:
    engine_request = _engine_request(service, body, ids, request_id)
    gen = service.submit(engine_request)
    logprobs = None if body.top_logprobs_asked() is None else LogprobStream(service.tokenizer, chat)
    fmt = ResponseFormat(request_id, service.model_name, int(time.time()), chat, len(ids), logprobs)
    headers = {"X-Request-Id": request_id}
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return EventSourceResponse(_events(service, gen, body, fmt, usage), headers=headers,
                                   shutdown_grace_period=service.cfg.shutdown_grace_s + 5.0)
    final = await _final(service, gen, request)
    if final is None:
        return Response(status_code=CLIENT_GONE)
    if final.error is not None:
        raise service.failure(final)
    text = _text_stream(service, body).full(final.tokens)
    return JSONResponse(fmt.full(text, final), headers=headers)


def _text_stream(service: Service, body: GenerationRequest) -> TextStream:
    """How this request's tokens become its text (stop strings, special tokens)."""
    return TextStream(service.tokenizer, stops=body.stop_strings(), include_stop=body.include_stop_str_in_output,
                      skip_special_tokens=body.skip_special_tokens,
                      spaces_between_special_tokens=body.spaces_between_special_tokens)


async def _final(service: Service, gen: Generation, request: Request) -> Update | None:
    """The request's last update, or None if its client disconnected first (then it is cancelled)."""
    check_at = time.monotonic() + DISCONNECT_POLL_S
    while True:
        try:
            update = await asyncio.wait_for(gen.queue.get(), DISCONNECT_POLL_S)
            if update.finished:
                return update
        except TimeoutError:
            pass
        if time.monotonic() >= check_at:
            check_at = time.monotonic() + DISCONNECT_POLL_S
            if await request.is_disconnected():
                service.cancel(gen)
                return None


async def _events(service: Service, gen: Generation, body: GenerationRequest, fmt: ResponseFormat,
                  usage: bool) -> AsyncIterator[dict[str, str]]:
    """SSE events of one streamed request; cancels it if the stream is torn down early."""
    text, final = _text_stream(service, body), None
    try:
        if fmt.chat:
            yield fmt.role_chunk()
        while final is None:
            update = await gen.queue.get()
            if update.error is not None:
                final = update
                yield {"data": json.dumps(service.failure(update).body())}
                break
            piece = text.piece(update.tokens, update.finished)
            final = update if update.finished else None
            if piece or final is not None:
                yield fmt.chunk(piece, None if final is None else final.finish_reason, update)
        if usage and final.error is None:
            yield fmt.usage_chunk(len(final.tokens))
        yield {"data": "[DONE]"}
    finally:
        if final is None:  # the client went away (or the server stopped streaming)
            service.cancel(gen)

