# syntax=docker/dockerfile:1
#
# The projector in a container: a static binary on a distroless base that
# holds CA certificates (for TLS to Kafka, PostgreSQL and the authority) and
# time zone data, running as a non-root user.
#
#   docker build -t projector .
#   docker run --rm projector version
#   docker run --rm -e DATABASE_URL=... -e PROJECTOR_BROKERS=... -p 8080:8080 projector run
#
# The build context must include .git for `projector version` and
# projector_build_info to name the commit (-buildvcs); without it they say
# the revision is unknown.

FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# CGO off: a static binary that needs no libc in the final image.
RUN CGO_ENABLED=0 go build -buildvcs=true -trimpath -ldflags="-s -w" -o /out/projector ./cmd/projector \
 && /out/projector version

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/projector /usr/local/bin/projector
USER nonroot:nonroot
# /healthz, /readyz, /status and /metrics
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/projector"]
CMD ["run"]
