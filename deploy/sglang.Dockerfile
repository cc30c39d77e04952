# SGLang with the PRISM DART plugin (docs/deploy.md, docs/dart-plugin.md).
#
#   docker build -f deploy/sglang.Dockerfile -t prism-sglang .
#
# The official image, unmodified, plus this project installed with --no-deps: the image's
# torch, sglang and kernels stay exactly as shipped. The package registers the entry point
# `prism_dart` in SGLang's plugin group `sglang.srt.plugins`, so every scheduler process
# loads it; `--radix-cache-backend prism_dart` selects the DART-ordered radix cache. The
# plugin pins sglang==0.5.23: the build fails if the base image carries another version.
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23-cu130
FROM ${SGLANG_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1

WORKDIR /opt/prism-src
COPY pyproject.toml README.md ./
COPY prism_wire ./prism_wire
COPY prism_tokens ./prism_tokens
COPY prism_proxy ./prism_proxy
COPY prism_sim ./prism_sim
COPY backend_plugin ./backend_plugin
COPY sglang_cpu ./sglang_cpu
COPY loadgen ./loadgen
COPY bench ./bench
RUN python3 -m pip install --no-deps . && rm -rf /opt/prism-src
WORKDIR /sgl-workspace

# Fail the build early if the base image is not the SGLang the plugin was written for, or
# if SGLang's plugin group does not see the entry point.
RUN python3 -c "import importlib.metadata as md; \
v = md.version('sglang'); \
assert v == '0.5.23', 'PRISM DART needs sglang==0.5.23, image has ' + v; \
names = [e.name for e in md.entry_points(group='sglang.srt.plugins')]; \
assert 'prism_dart' in names, names; \
print('sglang', v, 'plugins', names)"

EXPOSE 30000
HEALTHCHECK --interval=15s --timeout=10s --start-period=600s --retries=5 \
    CMD curl -fsS http://127.0.0.1:30000/health || exit 1
# SGLang's own launcher through backend_plugin.launch: it adds `--api-key` and
# `--admin-api-key` from PRISM_ENGINE_API_KEY / PRISM_ENGINE_ADMIN_API_KEY (or their
# *_FILE variants) to SGLang's argv inside the process, never to a command line, and
# refuses them as flags.
ENTRYPOINT ["python3", "-m", "backend_plugin.launch"]
CMD ["--host", "0.0.0.0", "--port", "30000", "--enable-metrics", "--enable-cache-report", \
     "--incremental-streaming-output", "--radix-cache-backend", "prism_dart"]
