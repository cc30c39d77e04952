"""Shared by the live tokenizer tests: SGLang's own count of the HTTP requests it got, by
endpoint (`sglang:http_requests_total`, which a server started with `--enable-metrics`
keeps in its HTTP middleware: every request that reached it, whatever its answer), the
openai client's chat straight to an engine and through the proxy, and model directories
that are not the served model's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from prism_proxy.app import RunningProxy, start_proxy
from prism_proxy.config import ProxyConfig

CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Answer from the passage in one short line."},
        {
            "role": "user",
            "content": "The river Osse flows into the Calder Sea. Where does it flow? "
            "Répondez en français, s'il vous plaît: 3 mots.",
        },
    ],
    "max_tokens": 4,
    "temperature": 0,
}


def http_requests(url: str, endpoint: str) -> float:
    """Requests the engine at `url` got on `endpoint`, all methods and answers."""
    text = httpx.get(url + "/metrics", timeout=30.0).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "sglang:http_requests":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("endpoint") == endpoint:
                total += sample.value
    return total


async def prompt_tokens(base_url: str, **extra: Any) -> int:
    """The openai client's chat `CHAT` against `base_url` (an engine or the proxy)."""
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    async with client:
        answer = await client.chat.completions.create(**CHAT, **extra)
    assert answer.usage is not None
    return answer.usage.prompt_tokens


async def plain_proxy(backend: str, **overrides: Any) -> RunningProxy:
    """The proxy as a user starts it: no control RPC, every setting its default (the
    tokenizer too: `auto`) unless given; no periodic probes."""
    settings: dict[str, Any] = {
        "backend": backend,
        "port": 0,
        "health_interval_s": 0,
        "ready_interval_s": 0,  # no readiness probes either
        "shutdown_timeout_s": 5.0,
        **overrides,
    }
    return await start_proxy(ProxyConfig(**settings))


def template_variant(model_dir: Path, directory: Path, template: str) -> Path:
    """`model_dir`'s tokenizer (the served vocabulary) with another chat template."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_dir / "tokenizer.json", directory / "tokenizer.json")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory
