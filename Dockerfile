# syntax=docker/dockerfile:1
# One image with every socialgraph binary: relation-svc, projection-svc, counter-svc,
# message-svc, the HTTP/JSON gateway (`gateway`) and the socialgraph CLI, in /usr/local/bin. The Helm chart
# (helm/socialgraph) runs each service and the gateway by naming its binary as the container
# command.
#
#   docker build -t registry.example.com/platform/socialgraph:0.1.0 .

FROM rust:1.95-bookworm AS builder
WORKDIR /src
# Protobuf is compiled by protox inside build.rs: no protoc needed.
COPY . .
# The cache mounts keep the crate registry and target/ between builds; the binaries are copied
# out of target/ because a cache mount is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --workspace \
        --bin relation-svc --bin projection-svc --bin counter-svc --bin message-svc --bin gateway --bin socialgraph \
    && mkdir -p /out \
    && cp target/release/relation-svc target/release/projection-svc \
          target/release/counter-svc target/release/message-svc target/release/gateway \
          target/release/socialgraph /out/

FROM debian:bookworm-slim
# CA certificates for TLS to databases, Redis, brokers and the OTLP collector.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 socialgraph \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin socialgraph
COPY --from=builder /out/ /usr/local/bin/
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
# gRPC: relation 50051, projection 50052, counter 50053, message 50054; gateway HTTP/JSON: 8080;
# admin HTTP: 9101, 9102, 9103, gateway 9104, message 9105.
EXPOSE 50051 50052 50053 50054 8080 9101 9102 9103 9104 9105
ENV RUST_LOG=info
CMD ["relation-svc", "serve"]
