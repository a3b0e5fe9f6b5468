# canaryd container image: build in the Rust image, run on Debian slim as a non-root user.
#
#   docker build -t canaryd .
#   docker run --rm -p 7878:7878 \
#     -v $PWD/config:/etc/canaryd:ro -v canaryd-data:/var/lib/canaryd \
#     -e CANARYD_TOKEN_OPS_ALICE=... -e GPU02_COMPOSE_MANAGER_TOKEN=... canaryd
#
# The config at /etc/canaryd/canaryd.yaml must say `listen: 0.0.0.0:7878` (with auth tokens:
# serve refuses a non-loopback listen without them) and `database: /var/lib/canaryd/canaryd.db`.
# Secrets come from the environment variables the config names, never from the image.

# ---- build -------------------------------------------------------------------------------
FROM rust:1-bookworm AS build
WORKDIR /src
# Dependencies first, so editing the sources does not rebuild them: a stub crate with the real
# manifest and lock file (Cargo wants every declared target's file, benches included).
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src tests/it benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs tests/it/main.rs \
 && for b in $(awk '/^\[\[bench\]\]/ {f = 1; next} f && /^name/ {gsub(/"/, "", $3); print $3; f = 0}' Cargo.toml); do \
      echo 'fn main() {}' > "benches/$b.rs"; \
    done \
 && cargo build --release --locked --bin canaryd \
 && rm -rf src tests benches
# The real sources. `migrations/`, `config/dev/`, `prod/` and `docs/openapi.yaml` are compiled
# in (sqlx::migrate!, include_str!), so they are needed here, not at run time.
COPY src src
COPY docs docs
COPY migrations migrations
COPY config config
COPY prod prod
COPY tests tests
COPY benches benches
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --bin canaryd \
 && strip target/release/canaryd

# ---- run ---------------------------------------------------------------------------------
FROM debian:bookworm-slim AS run
# tini reaps and forwards SIGTERM (canaryd stops cleanly on it; unfinished rollouts resume at
# the next start). ca-certificates for TLS endpoints behind a proxy.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 canaryd \
 && useradd --system --uid 10001 --gid canaryd --home-dir /var/lib/canaryd --shell /usr/sbin/nologin canaryd \
 && mkdir -p /etc/canaryd /var/lib/canaryd \
 && chown canaryd:canaryd /var/lib/canaryd
COPY --from=build /src/target/release/canaryd /usr/local/bin/canaryd
# The shipped runbooks; mount your own over /etc/canaryd/runbooks or point runbooks_dir elsewhere.
COPY runbooks /etc/canaryd/runbooks
USER canaryd:canaryd
WORKDIR /var/lib/canaryd
# Config (read-only: canaryd.yaml, env files, runbooks) and the SQLite database (WAL: keep the
# -wal and -shm files next to it, so mount the folder, not the file).
VOLUME ["/etc/canaryd", "/var/lib/canaryd"]
# Liveness and readiness for orchestrators: GET /healthz and GET /readyz on the listen port.
EXPOSE 7878
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/canaryd", "serve"]
CMD ["--config", "/etc/canaryd/canaryd.yaml"]
