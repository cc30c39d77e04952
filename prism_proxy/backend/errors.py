"""What the proxy makes of the backend's failures: `BackendError`, carrying the status
the client gets, and the message of an error answer as SGLang and FastAPI spell it."""

from __future__ import annotations

from typing import Any

import orjson


class BackendError(Exception):
    """The backend could not serve a request; `status` is what the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BackendAnswerError(BackendError):
    """The backend answered 2xx, but not with the JSON asked for."""


def error_of(body: Any) -> str | None:
    """The message of an error object (`error` as text or `{message}`, or `message`, or
    `detail`, as SGLang and FastAPI spell them); None if it has none."""
    if not isinstance(body, dict):
        return None
    error = body.get("error", body.get("message", body.get("detail")))
    if isinstance(error, dict):
        error = error.get("message", error)
    return None if error is None else str(error)[:500]


def error_message(status: int, text: str) -> str:
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text.strip()[:500] or f"HTTP {status}"
    message = error_of(body)
    return message if message is not None else text.strip()[:500]
