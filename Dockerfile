# vllm-sentinel: the daemon in a small image.
#   docker build -t vllm-sentinel .
#   docker run -p 9464:9464 -v sentinel-data:/data \
#     -v $PWD/sentinel.toml:/etc/vllm-sentinel/sentinel.toml:ro vllm-sentinel
# The configuration is read from SENTINEL_CONFIG (default below); listen on
# 0.0.0.0:9464 and keep the store under /data (see deploy/container/sentinel.toml).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The `dist` profile: whole-program optimization, everything optimized
# for size, for a smaller resident footprint (see Cargo.toml).
RUN cargo build --profile dist --locked --bin vllm-sentinel \
    && strip target/dist/vllm-sentinel

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/dist/vllm-sentinel /usr/local/bin/vllm-sentinel
COPY deploy/container/sentinel.toml /etc/vllm-sentinel/sentinel.toml
# The store lives here; mount a volume (it must be writable by uid 65532).
VOLUME ["/data"]
WORKDIR /data
ENV SENTINEL_CONFIG=/etc/vllm-sentinel/sentinel.toml
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/vllm-sentinel", "serve"]
