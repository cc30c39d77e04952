"""The token path's lean HTTP/1.1 client (`prism_proxy.backend.http1`), over real loopback
TCP against an aiohttp server and against scripted servers that misbehave in the ways a
backend can: closing idle or mid-answer, sending invalid HTTP, never answering."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from proxy_support import eventually

import prism_proxy.backend.http1 as backend_http
from prism_proxy.backend.http1 import BackendProtocolError, Http1Pool

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server running `script` per connection; yields its URL and a one-item list
    counting the connections it accepted."""
    accepted = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        try:
            await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (Content-Length framed, as the pool sends them)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


def pool_for(url: str, **kwargs: float) -> Http1Pool:
    return Http1Pool(url, connect_timeout_s=2.0, read_timeout_s=kwargs.pop("read", 5.0), **kwargs)


async def post_read(pool: Http1Pool, body: bytes = b"{}") -> tuple[int, bytes]:
    async with pool.post("/generate", body) as response:
        return response.status, await response.read()


# --- against aiohttp's server ---------------------------------------------------------------
@pytest.fixture
async def aiohttp_backend() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """`/generate` echoing the body (Content-Length), `/stream` sending one chunk, then a
    second once the test sets the event (chunked)."""
    proceed = asyncio.Event()

    async def generate(request: web.Request) -> web.Response:
        return web.Response(body=await request.read(), content_type="application/json")

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await proceed.wait()
        await response.write(b"data: two\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_post("/stream", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", proceed
    await runner.cleanup()


async def test_a_body_comes_back_and_the_connection_is_reused(aiohttp_backend) -> None:
    url, _ = aiohttp_backend
    pool = pool_for(url)
    assert await post_read(pool, b'{"n": 1}') == (200, b'{"n": 1}')
    assert await post_read(pool, b'{"n": 2}') == (200, b'{"n": 2}')
    assert pool.open_connections == 1
    pool.close()


async def test_a_chunked_stream_arrives_as_the_server_flushes_it(aiohttp_backend) -> None:
    url, proceed = aiohttp_backend
    pool = pool_for(url)
    async with pool.post("/stream", b"{}") as response:
        assert response.status == 200 and response.content_type == "text/event-stream"
        pieces = response.iter_any()
        assert await anext(pieces) == b"data: one\n\n"  # before the server sends the rest
        proceed.set()
        assert b"".join([piece async for piece in pieces]) == b"data: two\n\n"
    assert await post_read(pool) == (200, b"{}")  # on the same connection again
    assert pool.open_connections == 1
    pool.close()


async def test_concurrent_requests_each_get_their_own_connection(aiohttp_backend) -> None:
    url, _ = aiohttp_backend
    pool = pool_for(url)
    bodies = [b'{"i": %d}' % i for i in range(8)]
    answers = await asyncio.gather(*(post_read(pool, body) for body in bodies))
    assert answers == [(200, body) for body in bodies]
    assert pool.open_connections == 8
    pool.close()


# --- against scripted servers ------------------------------------------------------------
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def answer_once_then_close(reader, writer) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()

    async with scripted(answer_once_then_close) as (url, accepted):
        pool = pool_for(url)
        assert await post_read(pool) == (200, b"{}")
        await eventually(lambda: pool.open_connections == 0)  # the server's close arrived
        assert await post_read(pool) == (200, b"{}")
        assert accepted[0] == 2
        pool.close()


async def test_an_idle_connection_is_dropped_after_idle_s() -> None:
    async def answer_forever(reader, writer) -> None:
        while True:
            await read_request(reader)
            writer.write(OK)
            await writer.drain()

    async with scripted(answer_forever) as (url, accepted):
        pool = pool_for(url, idle_s=60.0)
        await post_read(pool)
        await post_read(pool)
        assert accepted[0] == 1
        pool.idle_s = 0.0  # every idle connection is now too old to reuse
        await post_read(pool)
        assert accepted[0] == 2
        pool.close()


async def test_a_close_mid_answer_fails_after_what_arrived() -> None:
    async def close_mid_chunk(reader, writer) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)

    async with scripted(close_mid_chunk) as (url, _):
        pool = pool_for(url)
        async with pool.post("/generate", b"{}") as response:
            pieces = response.iter_any()
            assert await anext(pieces) == b"hello"
            with pytest.raises(BackendProtocolError, match="closed the connection mid-answer"):
                await anext(pieces)
        assert pool.open_connections == 0


async def test_a_close_before_any_answer_fails() -> None:
    async def close_at_once(reader, writer) -> None:
        await read_request(reader)

    async with scripted(close_at_once) as (url, _):
        pool = pool_for(url)
        with pytest.raises(BackendProtocolError):
            await post_read(pool)


async def test_invalid_http_fails_and_closes() -> None:
    async def garbage(reader, writer) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client hangs up

    async with scripted(garbage) as (url, _):
        pool = pool_for(url)
        with pytest.raises(BackendProtocolError, match="invalid HTTP"):
            await post_read(pool)
        assert pool.open_connections == 0


async def test_silence_times_out_after_read_timeout() -> None:
    async def never_answer(reader, writer) -> None:
        await read_request(reader)
        await reader.read()  # until the client hangs up

    async with scripted(never_answer) as (url, _):
        pool = pool_for(url, read=0.1)
        with pytest.raises(TimeoutError):
            await post_read(pool)
        assert pool.open_connections == 0


async def test_a_body_delimited_by_the_close_is_read_whole_and_not_reused() -> None:
    async def http10_style(reader, writer) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()

    async with scripted(http10_style) as (url, accepted):
        pool = pool_for(url)
        assert await post_read(pool) == (200, b"all of it")
        assert await post_read(pool) == (200, b"all of it")
        assert accepted[0] == 2
        pool.close()


async def test_an_answer_left_unread_closes_its_connection() -> None:
    reader_left = asyncio.Event()

    async def two_chunks(reader, writer) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
            await writer.drain()
            await reader_left.wait()  # the second chunk only after the first reader left
            writer.write(b"3\r\ntwo\r\n0\r\n\r\n")
            await writer.drain()

    async with scripted(two_chunks) as (url, accepted):
        pool = pool_for(url)
        async with pool.post("/generate", b"{}") as response:
            assert await anext(response.iter_any()) == b"one"  # the reader stops here
        reader_left.set()
        assert await post_read(pool) == (200, b"onetwo")
        assert accepted[0] == 2
        pool.close()


async def test_a_slow_reader_pauses_the_socket_and_loses_nothing(monkeypatch) -> None:
    monkeypatch.setattr(backend_http, "HIGH_WATER", 1024)
    reading: list[bool] = []  # the socket's state after each piece of body
    on_body = backend_http.Http1Connection.on_body

    def watched(self, body: bytes) -> None:
        on_body(self, body)
        reading.append(self.transport.is_reading())

    monkeypatch.setattr(backend_http.Http1Connection, "on_body", watched)
    payload = bytes(range(256)) * 1024  # 256 KiB

    async def big(reader, writer) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        await writer.drain()
        await reader.read()

    async with scripted(big) as (url, _):
        pool = pool_for(url)
        received = []
        async with pool.post("/generate", b"{}") as response:
            async for piece in response.iter_any():
                received.append(piece)
                await asyncio.sleep(0)  # the reader lags the socket
        assert b"".join(received) == payload
        assert False in reading  # paused behind the reader (and resumed: all of it came)
        pool.close()


async def test_a_refused_connection_raises_oserror() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        pool = pool_for(f"http://127.0.0.1:{port}")
        with pytest.raises(OSError):
            await post_read(pool)


def test_only_http_urls_are_accepted() -> None:
    with pytest.raises(ValueError, match="expected http"):
        Http1Pool("unix:///tmp/x", connect_timeout_s=1.0, read_timeout_s=1.0)


async def test_a_path_prefix_and_the_host_header_are_sent() -> None:
    seen: list[bytes] = []

    async def record(reader, writer) -> None:
        head, _ = await read_request(reader)
        seen.append(head)
        writer.write(OK)
        await writer.drain()

    async with scripted(record) as (url, _):
        pool = pool_for(url + "/engine/")
        await post_read(pool, b'{"x": 1}')
        pool.close()
    head = seen[0].decode()
    assert head.startswith("POST /engine/generate HTTP/1.1\r\n")
    assert f"Host: {url.removeprefix('http://')}\r\n" in head
    assert "Content-Length: 8\r\n" in head
