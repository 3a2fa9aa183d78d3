# token-finalizer: the finalizer HTTP service (and, with another command, a capture store).
#
#   docker build -t token-finalizer .
#   docker run -p 8000:8000 token-finalizer             # embedded default: ./capture in the image
#   export WRITER_TOKEN=... STORE_FINALIZER_TOKEN=... STORE_CONTROL_TOKEN=...  # docker-compose.yml
#   export FINALIZER_TOKEN=... RETIRE_KEY=...                                  # needs all five
#   docker compose up --build                            # redis, capture store, 2 finalizer replicas

# The base: a public slim Python image by default. Its minor version is fixed
# and its patch release follows the tag, so a rebuild takes Python's security
# fixes (pin a digest, python:3.12-slim@sha256:..., for byte-identical rebuilds).
# Any base with python3 and its venv module works: CI, which reaches no
# registry, builds on one bootstrapped from Debian packages (.ci/compose-e2e).
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Offline builds (CI): --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=URL
# install every wheel from URL and nothing from an index; pip reads both here.
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
RUN python3 -m venv /opt/venv
COPY pyproject.toml README.md constraints.txt /src/
COPY service /src/service
COPY client /src/client
# Every dependency at the version in the committed constraints file.
RUN /opt/venv/bin/pip install -c /src/constraints.txt /src/client /src

FROM ${BASE_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# A fixed numeric uid lets orchestrators verify runAsNonRoot; /data is owned by
# it so a named volume mounted there starts writable.
RUN groupadd --system --gid 10001 finalizer \
    && useradd --system --uid 10001 --gid finalizer --no-create-home \
        --home-dir /var/lib/token-finalizer --shell /usr/sbin/nologin finalizer \
    && install -d -o finalizer -g finalizer /var/lib/token-finalizer /data
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
WORKDIR /var/lib/token-finalizer
EXPOSE 8000
# Slim images have no curl; python's urllib raises (exit 1) on anything but a 2xx.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=3)"]
# Exec form: the server is PID 1 and receives SIGTERM itself, so in-flight
# finalizes complete before the container stops.
CMD ["token-finalizer", "serve", "--host", "0.0.0.0", "--port", "8000"]
