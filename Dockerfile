# pplex-trio, one process per GPU (docs/DEPLOY.md). Mirrors .ci/setup's runtime install:
# Debian's libopus for the fast Opus encoder, torch pinned as .ci/setup pins it, then the package.
# (Not built on the project's development machines, which reach only the package registries.)
#
#   docker build -t pplex-trio .
#   docker run --gpus '"device=0"' -p 8998:8998 -e HF_TOKEN pplex-trio
# The settings are deploy/serve.example.toml; mount your own file over it:
#   docker run ... -v "$PWD/serve.toml:/etc/pplex-trio/serve.toml:ro" pplex-trio
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libopus0 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/pplex-trio
# torch first, in its own layer: it is large and changes less often than the code.
# On Linux, PyPI's torch wheel carries CUDA; .ci/setup gets the same version as a CPU wheel.
RUN pip install --no-cache-dir "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY pplex_trio ./pplex_trio
COPY static ./static
RUN pip install --no-cache-dir ".[webrtc]" \
    && python -c "from pplex_trio.codec import libopus_available as a; assert a(), 'libopus missing'"
COPY deploy/serve.example.toml /etc/pplex-trio/serve.toml

# Not root; the Hugging Face cache (weights, voices) in a volume worth keeping.
RUN useradd --create-home --uid 10001 pplex
USER pplex
ENV HF_HOME=/home/pplex/.cache/huggingface PYTHONUNBUFFERED=1
VOLUME /home/pplex/.cache/huggingface

EXPOSE 8998
# Exec form: the server is PID 1 and gets SIGTERM itself (the drain, then exit).
ENTRYPOINT ["pplex-trio"]
# In a container the server must listen on every interface of its own network namespace.
CMD ["serve", "--config", "/etc/pplex-trio/serve.toml", "--host", "0.0.0.0"]
HEALTHCHECK --interval=10s --timeout=5s --start-period=900s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8998/health', timeout=4)"]
