# sgl-model-gateway (smg 1.13.0, Rust, from its PyPI wheel) for the scale-out profile of
# the compose files (docs/scale-out.md): it routes clients over several PRISM replicas.
#
#   docker build -f deploy/smg.Dockerfile -t prism-smg .
#
# Only what `smg launch` imports is installed (bench/PEERS.md: --no-deps plus
# setproctitle); the version is pinned in bench/peer-requirements/smg.txt.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY bench/peer-requirements/smg.txt /tmp/smg.txt
RUN pip install --no-deps -r /tmp/smg.txt && rm /tmp/smg.txt

RUN useradd --system --uid 10001 --user-group --no-create-home smg
USER smg
EXPOSE 8080
# `python -m smg launch`, with `--api-key` (the key smg sends to its workers and requires of
# its clients) taken from SMG_API_KEY when set: added to smg's argv inside the process,
# so it is never on a command line (readable by every user of the host in /proc).
ENTRYPOINT ["python", "-c", "import os, runpy, sys; key = os.environ.get('SMG_API_KEY'); sys.argv = ['smg', *sys.argv[1:], *(['--api-key', key] if key else [])]; runpy.run_module('smg', run_name='__main__', alter_sys=True)", "launch"]
