"""OpenAI error objects: `{"error": {"message", "type", "param", "code"}}` for every failure.

FastAPI's own 422 validation errors and malformed JSON become 400s with a message that
names the field; 429 (queue full) and 503 (shutting down) carry `Retry-After`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from runtime.serving.requests import RequestError

RETRY_AFTER_S = 1  # what 429 / 503 tell a client to wait before retrying

# status -> OpenAI error type
TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
         429: "rate_limit_error", 500: "internal_server_error", 503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "internal_server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """The first pydantic/FastAPI error as a 400 that names its field."""
    first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    path = [str(p) for p in first.get("loc", ())[1:]]  # drop "body"
    param = ".".join(path) or None
    if first["type"] == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', first['msg'])}", None,
                        "invalid_json")
    if first["type"] == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param, "unknown_parameter")
    if first["type"] == "missing" and not path:
        return APIError(400, "the request body is missing: send a JSON object", None, "invalid_request")
    if first["type"] == "model_attributes_type" and not path:
        return APIError(400, "the request body must be a JSON object (Content-Type: application/json)", None,
                        "invalid_request")
    return APIError(400, f"{param or 'body'}: {first['msg']}", param, "invalid_value")


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(RequestError)
    async def _refused(request: Request, err: RequestError) -> JSONResponse:
        return APIError(400, str(err), err.param, err.code).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return validation_error(list(err.errors())).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException) -> JSONResponse:
        return APIError(err.status_code, str(err.detail)).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {type(err).__name__}: {err}").response()
