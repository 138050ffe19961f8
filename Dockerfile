# Build: docker build -t tasklease .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/runner ./cmd/runner && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/fencedemo ./cmd/fencedemo

# exec stages usually need a shell; keep a small base that has one.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/runner /out/fencedemo /usr/local/bin/
COPY config.example.yaml /etc/tasklease/config.yaml
USER 65534:65534
EXPOSE 8080
ENTRYPOINT ["runner"]
CMD ["serve", "--config", "/etc/tasklease/config.yaml", "--listen", "0.0.0.0:8080"]
