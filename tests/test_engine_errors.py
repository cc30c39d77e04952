"""An engine's error that shows the client's input was at fault is the client's 400,
naming the field, whatever status the engine gave it (SGLang 0.5.23's words for a
grammar xgrammar cannot compile; tests/sglang/test_live_hostile.py sends such grammars
to the real engine through the proxy)."""

from __future__ import annotations

import pytest

from prism_proxy.backend.errors import BackendError
from prism_proxy.edge.errors import backend_failure, input_fault

COMPILE = "Failed to compile {} grammar: [05:35:34] /project/cpp/grammar_parser.cc:820: ..."


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (COMPILE.format("ebnf"), "ebnf"),
        (COMPILE.format("regex"), "regex"),
        (COMPILE.format("json"), "response_format"),
        (COMPILE.format("structural_tag"), "response_format"),
        ("backend answered HTTP 500: " + COMPILE.format("ebnf"), "ebnf"),
        ("backend answered HTTP 500: Internal server error: 'messages'", None),
        ("Grammar preprocessing timed out", None),  # the engine's load, not the input
        ("backend unreachable", None),
    ],
)
def test_input_fault_names_the_field(message: str, param: str | None) -> None:
    assert input_fault(message) == param


@pytest.mark.parametrize("status", [400, 502])
def test_a_grammar_the_engine_cannot_compile_is_a_400(status: int) -> None:
    error = backend_failure(BackendError(status, COMPILE.format("ebnf")))
    assert (error.status, error.param, error.kind) == (400, "ebnf", "invalid_request_error")


def test_other_backend_failures_keep_their_status() -> None:
    error = backend_failure(BackendError(502, "backend answered HTTP 500: boom"))
    assert (error.status, error.param, error.kind) == (502, None, "backend_error")
    refused = backend_failure(BackendError(404, "no such model"))
    assert (refused.status, refused.param) == (404, None)
