# syntax=docker/dockerfile:1
# tfrecordd in a container. Build: docker build -t tfrecordd .
# Run (as the README says; the image's user, 10001, owns its volumes):
#   sudo install -d -o 10001 -g 10001 /srv/spool /srv/tfrecordd
#   docker run -d --name tfrecordd --stop-timeout 60 -p 127.0.0.1:9464:9464 \
#     -v /srv/spool:/var/spool/tfrecordd -v /srv/tfrecordd:/var/lib/tfrecordd tfrecordd

FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# A C compiler for the optional hot path (setup.py); only this stage has it.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY daemon/ daemon/
COPY plugins/ plugins/
# tfrecordd's wheel and every dependency's, so the runtime stage installs offline and needs no
# compiler.
RUN pip wheel --wheel-dir /wheels .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="tfrecordd" \
      org.opencontainers.image.description="Events to rotating, compressed TFRecord shards, exactly once" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed numeric id, so volume ownership is stable across rebuilds and runAsNonRoot can check it.
RUN groupadd --system --gid 10001 tfrecordd \
 && useradd --system --uid 10001 --gid tfrecordd --home-dir /var/lib/tfrecordd \
      --no-create-home --shell /usr/sbin/nologin tfrecordd \
 && install -d -o tfrecordd -g tfrecordd -m 0750 \
      /var/lib/tfrecordd /var/lib/tfrecordd/shards /run/tfrecordd \
 && install -d -o tfrecordd -g tfrecordd -m 2770 /var/spool/tfrecordd

RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels /wheels/tfrecordd-*.whl

# The container's config: the metrics endpoint listens on 0.0.0.0 so the published port reaches it.
COPY config/docker.toml /etc/tfrecordd/tfrecordd.toml

# Declared after the directories exist, so new volumes start owned by tfrecordd.
VOLUME ["/var/spool/tfrecordd", "/var/lib/tfrecordd"]
WORKDIR /var/lib/tfrecordd
USER 10001:10001
EXPOSE 9464
# The daemon drains and publishes its open shards on SIGTERM within drain_timeout (30 s by
# default): give `docker stop` more than that (--stop-timeout 60, compose stop_grace_period: 60s).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["tfrecordd", "healthcheck"]
ENTRYPOINT ["tfrecordd"]
CMD ["run", "--config", "/etc/tfrecordd/tfrecordd.toml"]
