# canaryd container image: build in the Rust image, run on Debian slim as a non-root user.
#
#   docker build -t canaryd .
#   docker run --rm -p 7878:7878 \
#     -v "$PWD/config:/etc/canaryd:ro" -v canaryd-data:/var/lib/canaryd \
#     -e CANARYD_TOKEN_OPS_ALICE=... -e CANARYD_TOKEN_ONCALL=... -e CANARYD_TOKEN_AUDIT=... \
#     -e GPU02_COMPOSE_MANAGER_TOKEN=... \
#     canaryd --config /etc/canaryd/canaryd.container.yaml
#
# Layout: the binary in /usr/local/bin, the shipped runbooks in /usr/share/canaryd/runbooks
# (outside the config mount, so mounting a config folder does not hide them), the config
# folder at /etc/canaryd (read-only), the SQLite database in the /var/lib/canaryd volume
# (owned by uid 10001; a named volume inherits that, a bind-mounted folder must be chown'd).
# config/canaryd.container.yaml is config/canaryd.yaml with these paths and
# `listen: 0.0.0.0:7878`; without --config the image reads /etc/canaryd/canaryd.yaml, so a
# folder of your own needs only that file (absolute database and runbooks_dir as above).
# Secrets come from the environment variables the config names, never from the image.

# ---- build -------------------------------------------------------------------------------
FROM rust:1-bookworm AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# Dependencies first, so editing the sources does not rebuild them: a stub crate with the real
# manifest and lock file (Cargo wants every declared target's file, benches included).
# The simulated host is a workspace member (`sim/`), stubbed the same way.
COPY Cargo.toml Cargo.lock ./
COPY sim/Cargo.toml sim/
RUN mkdir -p src tests/it benches sim/src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs tests/it/main.rs sim/src/lib.rs \
 && awk '/^\[\[bench\]\]/ {f = 1; next} f && /^name/ {gsub(/"/, "", $3); print $3; f = 0}' Cargo.toml \
    | while read -r b; do echo 'fn main() {}' > "benches/$b.rs"; done \
 && cargo build --release --locked --bin canaryd \
 && rm -rf src tests benches sim/src
# The real sources. `migrations/`, `config/dev/`, `prod/` and `docs/openapi.yaml` are compiled
# in (sqlx::migrate!, include_str!), so they are needed here, not at run time.
COPY src src
COPY sim sim
COPY docs docs
COPY migrations migrations
COPY config config
COPY prod prod
COPY tests tests
COPY benches benches
RUN touch src/main.rs src/lib.rs sim/src/lib.rs \
 && cargo build --release --locked --bin canaryd \
 && strip target/release/canaryd

# ---- run ---------------------------------------------------------------------------------
FROM debian:bookworm-slim AS run
# tini reaps and forwards SIGTERM (canaryd stops cleanly on it; unfinished rollouts resume at
# the next start). ca-certificates for TLS endpoints behind a proxy. Not pinned: the bookworm
# archive keeps only the current (security-patched) version of each package.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 canaryd \
 && useradd --system --uid 10001 --gid canaryd --home-dir /var/lib/canaryd --shell /usr/sbin/nologin canaryd \
 && mkdir -p /etc/canaryd /var/lib/canaryd /usr/share/canaryd \
 && chown 10001:10001 /var/lib/canaryd
COPY --from=build /src/target/release/canaryd /usr/local/bin/canaryd
# The shipped runbooks, outside /etc/canaryd so that a config mount does not hide them.
COPY runbooks /usr/share/canaryd/runbooks
USER 10001:10001
WORKDIR /var/lib/canaryd
# Config (read-only: canaryd.yaml, env files) and the SQLite database (WAL: keep the -wal and
# -shm files next to it, so mount the folder, not the file).
VOLUME ["/etc/canaryd", "/var/lib/canaryd"]
EXPOSE 7878
# Liveness for Docker; orchestrators can also probe GET /healthz and GET /readyz on the port.
# A config listening elsewhere than port 7878 needs its own `healthcheck --url`.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/canaryd", "healthcheck", "--url", "http://127.0.0.1:7878/healthz"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/canaryd", "serve"]
CMD ["--config", "/etc/canaryd/canaryd.yaml"]
