# acp-gateway in a container: built in the Rust image, run in slim Debian as
# an unprivileged user. See deploy/README.md for the first token, the
# compose file, and adding real agents (--target with-agents).

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# The dependencies first, in a layer of their own: it is rebuilt only when
# Cargo.toml or Cargo.lock change, not for every change of the sources.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin benches \
    && echo 'fn main() {}' > src/main.rs \
    && echo 'fn main() {}' > src/bin/acp-demo-agent.rs \
    && touch src/lib.rs \
    && for bench in gateway memory soak; do echo 'fn main() {}' > "benches/$bench.rs"; done \
    && cargo build --release --locked --bin acp-gateway \
    && rm -rf src benches
COPY src src
COPY migrations migrations
COPY web web
COPY benches benches
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin acp-gateway

FROM debian:bookworm-slim AS runtime
# Debian's current packages (security updates included), not pinned versions;
# git (2.40 or later, from bookworm-backports) for conversations made on a repository.
# hadolint ignore=DL3008
RUN echo "deb http://deb.debian.org/debian bookworm-backports main" > /etc/apt/sources.list.d/backports.list \
    && apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && apt-get install -y --no-install-recommends -t bookworm-backports git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/acp-gateway acp \
    && mkdir -p /var/lib/acp-gateway/data /srv/work \
    && chown -R acp:acp /var/lib/acp-gateway /srv/work
COPY --from=build /src/target/release/acp-gateway /usr/local/bin/acp-gateway
USER 10001
WORKDIR /var/lib/acp-gateway
# Listening beyond loopback needs a token first (the gateway refuses to start
# otherwise): docker compose run --rm gateway token create --user NAME --role operator
ENV ACP_GATEWAY_LISTEN=0.0.0.0:8080 \
    XDG_DATA_HOME=/var/lib/acp-gateway/data
VOLUME ["/var/lib/acp-gateway/data"]
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["curl", "-fsS", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["acp-gateway"]
CMD ["serve"]

# The same, with Node.js and the ACP adapters of Claude Code, Codex and
# Gemini CLI (docker build --target with-agents -t acp-gateway:agents .).
FROM runtime AS with-agents
USER 0
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs npm \
    && rm -rf /var/lib/apt/lists/* \
    && npm install -g --no-audit --no-fund \
        @zed-industries/claude-code-acp@0.16.2 @zed-industries/codex-acp@0.16.0 \
        @google/gemini-cli@0.61.0 \
    && npm cache clean --force
USER 10001
