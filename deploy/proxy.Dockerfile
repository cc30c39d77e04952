# PRISM admission proxy: `prism-proxy serve` (docs/deploy.md).
#
#   docker build -f deploy/proxy.Dockerfile -t prism-proxy .
#   docker run -p 8000:8000 -e PRISM_BACKEND=http://sglang:30000 prism-proxy
#
# Every setting is a PRISM_* environment variable (docs/proxy.md); the image listens on
# 0.0.0.0:8000 and runs as an unprivileged user.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package needs, so the build cache survives edits elsewhere in the repo.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY prism_wire ./prism_wire
COPY prism_tokens ./prism_tokens
COPY prism_proxy ./prism_proxy
COPY prism_sim ./prism_sim
COPY backend_plugin ./backend_plugin
COPY sglang_cpu ./sglang_cpu
COPY loadgen ./loadgen
COPY bench ./bench
# `pip install .`: the runtime only, no extras (docs/install.md): none of the load
# generator's packages (numpy, matplotlib, ...). Every package is copied (the wheel's
# layout); `prism-loadgen` here names the extra it would need.
RUN pip install . && rm -rf /src

RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/prism prism
USER prism
WORKDIR /home/prism
ENV PRISM_HOST=0.0.0.0 \
    PRISM_PORT=8000 \
    PRISM_CACHE_DIR=/home/prism/.cache/prism
# Build the deterministic builtin tokenizer once, at image build time.
RUN python -c "from prism_tokens.tokenizer import load_tokenizer; load_tokenizer('builtin')"

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('PRISM_PORT', '8000'), timeout=2)" || exit 1
ENTRYPOINT ["prism-proxy", "serve"]
