# One image for every inventoryd command (serve, migrate, reconcile, config
# check). The Go version follows go.mod's go line (a test checks it).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=docker
RUN CGO_ENABLED=0 go build -ldflags "-X main.version=${VERSION}" -o /out/inventoryd ./cmd/inventoryd

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/inventoryd /inventoryd
EXPOSE 8080
ENTRYPOINT ["/inventoryd"]
