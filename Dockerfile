# syntax=docker/dockerfile:1
# The controller image: `docker build -t capi-ipam-provider-py:dev .`; for a release, add
# `--build-arg SOURCE=<repository URL> --build-arg REVISION=$(git rev-parse HEAD)`.
# Stage 1 installs the package and its pinned dependencies into a virtualenv; stage 2 copies only that
# virtualenv onto a clean base and runs it as an unprivileged user. The run-time image has no compiler, no
# build tools, no pip cache and no source tree.
# The base of both stages: any image with python3 (3.11, as requires-python allows), its venv module, and
# groupadd/useradd. The default is python:3.11-slim pinned by digest (`make docker-build IMAGE_BASE=pinned`); where no
# registry can be reached, `make docker-build` passes a local Debian base instead (hack/image/base.sh).
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# README.md and LICENSE are named in pyproject.toml (readme, license-files): the build needs them.
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY ipam_provider ./ipam_provider
COPY backends ./backends
# A regular (non-editable) install; pip compiles the .pyc files here, as the run-time root is read-only.
RUN pip install -c constraints.txt . \
 && pip check \
 && ipam-provider --help >/dev/null \
 && ipam-provider --version

FROM ${PYTHON_IMAGE}
# VERSION defaults to ipam_provider/version.py's __version__ (`ipam-provider --version`; a test keeps them equal).
ARG VERSION=0.2.0
ARG SOURCE=""
ARG REVISION=""
LABEL org.opencontainers.image.title="capi-ipam-provider-py" \
      org.opencontainers.image.description="Cluster API IPAM provider: in-cluster, NetBox and Infoblox pools" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}"
# A fixed numeric uid/gid, so that Kubernetes can check runAsNonRoot without a passwd lookup.
RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin nonroot
# jemalloc (ipam_provider/runtime/memory.py, ALLOCATOR_ENV): under claim churn glibc's heap grows, jemalloc's less.
# The local Debian base has it already; another Debian base gets it from its package mirror.
RUN dpkg -s libjemalloc2 >/dev/null 2>&1 \
 || { apt-get update && apt-get install -y --no-install-recommends libjemalloc2 && rm -rf /var/lib/apt/lists/*; }
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LD_PRELOAD=libjemalloc.so.2 \
    MALLOC_CONF=narenas:1
# The base this image was built on (the build argument: the pinned default or the local Debian base).
ARG PYTHON_IMAGE
LABEL org.opencontainers.image.base.name="${PYTHON_IMAGE}"
USER 65532:65532
WORKDIR /
# 8443: Prometheus metrics (HTTPS, authenticated); 8081: /healthz and /readyz.
EXPOSE 8443 8081
ENTRYPOINT ["ipam-provider"]
CMD ["run"]
