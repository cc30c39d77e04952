# PRISM simulated engine: `prism-sim`, SGLang's HTTP API on a CPU (docs/deploy.md).
#
#   docker build -f deploy/sim.Dockerfile -t prism-sim .
#   docker run -p 30000:30000 -e PRISM_CONTROL_TOKEN="$PRISM_CONTROL_TOKEN" prism-sim \
#       --eviction dart --control-port 30001
#
# Used by docker-compose.sim.yml in place of SGLang on machines without a GPU. It serves
# the same DART control RPC as the SGLang plugin (token from PRISM_CONTROL_TOKEN). It
# listens on all of the container's addresses whatever the arguments (the entrypoint's
# `--host 0.0.0.0`), so a published port reaches it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

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
RUN pip install . && rm -rf /src

RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/prism prism
USER prism
WORKDIR /home/prism
ENV PRISM_CACHE_DIR=/home/prism/.cache/prism
RUN python -c "from prism_tokens.tokenizer import load_tokenizer; load_tokenizer('builtin')"

EXPOSE 30000
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30000/health', timeout=2)" || exit 1
ENTRYPOINT ["prism-sim", "--host", "0.0.0.0"]
CMD ["--port", "30000"]
