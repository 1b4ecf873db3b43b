# Conveyor's server (and CLI) in a container.
#
#   docker build -t conveyor .
#   docker run -p 7700:7700 -v conveyor-data:/data conveyor
#   docker run --rm -v conveyor-data:/data conveyor token create --role admin
#
# It serves on 0.0.0.0:7700 over the SQLite file /data/conveyor.db (a volume). Listening beyond
# loopback turns access control on: every request but /healthz, /livez and /readyz needs a token,
# made with `conveyor token create` on the same store (the last command above, or
# `docker exec CONTAINER conveyor token create --role admin` beside a running server).
# CONVEYOR_STORE=postgres://... moves it to PostgreSQL (docker-compose.yml does).

# Build: the official Rust image, latest stable 1.x, on Debian 12 (the runtime's glibc).
# The whole context (.dockerignore keeps target/, .git and the clients' packages out): the
# crates embed files from beyond crates/ too (docs/openapi.yaml).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p conveyor \
    && cp target/release/conveyor /usr/local/bin/conveyor

# Run: Debian slim, the binary alone (TLS roots are built in), as an unprivileged user.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin conveyor \
    && mkdir /data \
    && chown conveyor:conveyor /data
COPY --from=build /usr/local/bin/conveyor /usr/local/bin/conveyor
# Defaults of `conveyor serve` (and of `token`, `migrate`, `store` run in the container): flags
# given on the command line win over these.
ENV CONVEYOR_LISTEN=0.0.0.0:7700 \
    CONVEYOR_STORE=sqlite:///data/conveyor.db
USER 10001:10001
WORKDIR /data
VOLUME /data
EXPOSE 7700
# SIGTERM (docker stop) drains: no new connections, requests in flight finish (up to
# --request-timeout-secs, 90 s by default). Give it that long: `docker stop -t 120`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["conveyor"]
CMD ["serve"]
