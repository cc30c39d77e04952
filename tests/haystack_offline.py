"""Haystack's names for tests/test_frameworks.py, imported with its telemetry off.

Haystack reads `HAYSTACK_TELEMETRY_ENABLED` once, when it is first imported: unless it
is false, the import writes a user id to ~/.haystack/config.yaml and every pipeline run
posts an event to PostHog. So this module sets it, then imports Haystack, and refuses to
load if something imported Haystack before it with telemetry on.
"""

import os

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

from haystack import Document, Pipeline
from haystack.components.builders import ChatPromptBuilder
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.telemetry import _telemetry
from haystack.utils import Secret

if _telemetry.telemetry is not None:
    raise ImportError("haystack was imported with its telemetry on before haystack_offline")

__all__ = [
    "ChatMessage",
    "ChatPromptBuilder",
    "Document",
    "OpenAIChatGenerator",
    "Pipeline",
    "Secret",
]
