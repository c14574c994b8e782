"""Errors of the OpenAI-compatible routes in OpenAI's shape, `{"error": {message, type, param,
code}}`, whatever raised them: the request's validation (400, `param` naming the field), the
API-key check (401), the route (404 unknown model, 422 a conversation the agents cannot take),
or the ingress (413 too long, 429 every agent at capacity, 503/504 no agent answered).

/predict keeps FastAPI's `{"detail": ...}`, so the conversion happens in the routes' own
`OpenAIRoute`, not in an app-wide exception handler.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from satseq.serving.openai_schema import ErrorDetail, ErrorResponse

# status → (OpenAI's error type, the code when the raiser gives none)
ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    413: ("invalid_request_error", "context_length_exceeded"),
    422: ("invalid_request_error", "unprocessable_messages"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("server_error", "no_agent_answered"),
    504: ("server_error", "timeout"),
}


class OpenAIError(HTTPException):
    """An HTTP error that names the request field at fault (`param`) and OpenAI's `code`."""

    def __init__(
        self, status_code: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(status_code, message)
        self.param = param
        self.code = code


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    kind, default_code = ERROR_KINDS.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None)
    )
    detail = ErrorDetail(message=message, type=kind, param=param, code=code or default_code)
    # ASCII-escaped: a message may quote the input, which may hold a lone surrogate
    body = json.dumps(ErrorResponse(error=detail).model_dump(), ensure_ascii=True)
    return Response(body, status, headers=headers, media_type="application/json")


def invalid_request(error: RequestValidationError) -> Response:
    """400 for a body that is not JSON or breaks the request schema: the first error, with
    `param` the field it is about (as a path: `messages[0].content`) and pydantic's error type
    as the code."""
    errors = error.errors()
    first = errors[0]
    param = field_path(first["loc"][1:], error.body, first["type"])
    where = f"{param}: " if param else ""
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    if first["type"] == "json_invalid":
        message = f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}"
    else:
        message = f"{where}{first['msg']}{more}"
    return error_response(400, message, param, first["type"])


def field_path(loc: tuple[Any, ...], body: Any, error_type: str) -> str | None:
    """The part of a pydantic error's `loc` that is a path into the request `body`: the names
    of a union's alternatives that pydantic adds to it are not keys of the body, so the walk
    stops there. A missing field ends the path with its name."""
    path: list[str | int] = []
    node = body
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if not (in_dict or in_list):
            if error_type == "missing" and isinstance(part, str):
                path.append(part)
            break
        node = node[part]
        path.append(part)
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
    return text.lstrip(".") or None


class OpenAIRoute(APIRoute):
    """A route whose errors, its validation's and its dependencies' included, are OpenAI's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handle_in_openai_shape(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as error:
                return invalid_request(error)
            except HTTPException as error:
                return error_response(
                    error.status_code,
                    str(error.detail),
                    getattr(error, "param", None),
                    getattr(error, "code", None),
                    error.headers,
                )

        return handle_in_openai_shape
