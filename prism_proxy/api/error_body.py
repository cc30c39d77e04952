"""OpenAI-style error bodies, and the field a pydantic validation error names."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from prism_proxy.api.segments import field_parts


def describe_validation_error(error: ValidationError) -> tuple[str, str]:
    """(`param`, message) naming the offending field, e.g. `messages.0.content`. Of a
    union's alternatives, the error that is not a plain type mismatch says what is
    wrong (`[[]]` as token ids: an empty list, not "a valid integer")."""
    errors = error.errors()
    first = next((e for e in errors if not str(e.get("type", "")).endswith("_type")), errors[0])
    param = ".".join(str(part) for part in field_parts(first.get("loc", ()))) or "body"
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return param, f"{param}: {message}"


def openai_error(message: str, *, kind: str, param: str | None = None, code: Any = None) -> dict:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
