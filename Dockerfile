# compactord: the daemon, its Spark (local mode by default) and Java 17 in one image.
#
#   docker build -t compactord .
#   docker run -d --name compactord -p 8642:8642 --stop-timeout 150 \
#     -v compactord-data:/var/lib/compactord \
#     -v "$PWD/token:/run/secrets/compactord-token:ro" \
#     -e COMPACTORD_CONF_kafkaBootstrapServers=kafka-1:9092,kafka-2:9092 \
#     compactord
#
# The base is pinned by its full tag (Debian bookworm: trixie has no openjdk-17). Pin it by digest too
# (python:3.11.13-slim-bookworm@sha256:...) once `docker buildx imagetools inspect` has told you the
# digest you reviewed.
FROM python:3.11.13-slim-bookworm

# tini as PID 1: it reaps the JVM's and Spark's Python workers' orphans and passes SIGTERM to
# compactord only (compactord stops its Spark JVM itself, after a running switch has finished).
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless tini; \
    rm -rf /var/lib/apt/lists/*; \
    ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17

ENV JAVA_HOME=/usr/lib/jvm/java-17 \
    PYSPARK_PYTHON=/usr/local/bin/python \
    PYSPARK_DRIVER_PYTHON=/usr/local/bin/python \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md /tmp/compactord-src/
COPY compactord /tmp/compactord-src/compactord
# The s3 extra (boto3): an s3:// ledger root needs it, and a container is where one is most often wanted.
RUN cd /tmp/compactord-src && pip install --no-cache-dir '.[s3]' && cd / && rm -rf /tmp/compactord-src

# The default configuration: every key not set here has its default (broker.conf.example); override
# one with COMPACTORD_CONF_<key>=value, or mount your own file over /etc/compactord/broker.conf.
# The token file must exist: the daemon refuses to start when a file: secret cannot be read.
RUN set -eux; \
    mkdir -p /etc/compactord; \
    printf '%s\n' \
      '# compactord in a container: see broker.conf.example for every key' \
      'httpBindAddress=0.0.0.0' \
      'httpPort=8642' \
      'httpAuthToken=file:/run/secrets/compactord-token' \
      'compactedLedgerRoot=/var/lib/compactord/ledgers' \
      > /etc/compactord/broker.conf

RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/compactord \
        --shell /usr/sbin/nologin compactord \
    && mkdir -p /var/lib/compactord/ledgers \
    && chown -R compactord:compactord /var/lib/compactord

# One writer per ledger root: never mount the same volume into two running containers.
VOLUME ["/var/lib/compactord"]
WORKDIR /var/lib/compactord
USER 10001:10001
EXPOSE 8642

# /healthz needs no token; it fails once the Spark JVM has died (the daemon then exits by itself).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", \
         "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8642/healthz', timeout=4)"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["compactord", "run", "--config", "/etc/compactord/broker.conf"]
