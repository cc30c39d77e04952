"""Give freed heap memory back to the OS after a large request.

A large prompt is parsed, tokenized (in a worker thread) and serialized in a few
hundred MB of short-lived allocations. CPython and the tokenizer free them, but glibc
keeps the freed pages in its arenas (one per thread that allocated), so the process's
RSS would stay at its peak: a 1 MB prompt left the proxy at ~200 MB instead of ~65 MB.
`malloc_trim(0)` returns those free pages; it costs about a millisecond and runs only
after large prompts. A no-op where the C library has no `malloc_trim` (not glibc).

glibc also gives each thread that allocates an arena of its own (up to 8 per core), and
memory freed in one arena serves only that arena again: the worker threads that tokenize
large prompts each kept a fragmented arena, and the proxy's RSS grew with the bytes
uploaded (38 MB over 100 MB of distinct segments, 56 MB over 250 MB, beyond its caches;
`python -m bench.memory_bound`). `limit_arenas` caps them at two (`M_ARENA_MAX`, what
`MALLOC_ARENA_MAX=2` does): the same 100 MB then grew RSS by nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


# mallopt's parameter number of M_ARENA_MAX (glibc's malloc.h).
_M_ARENA_MAX = -8


def limit_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas (call before the process starts its threads); False
    where the C library has no `mallopt` or refuses."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


def release_free_memory() -> None:
    """Return the heap's free pages to the OS (glibc `malloc_trim(0)`), if possible."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
