# tfinit as the entrypoint of the controller image you already run (a Crossplane provider-terraform
# image, or any image whose controller runs `terraform` from PATH).
#
#   scripts/build-image.sh BASE_IMAGE TAG            # recommended: also keeps the base's command
#   docker build --build-arg BASE_IMAGE=... -t TAG . # then restate the command (see CMD below)
#
# The result is BASE_IMAGE, unchanged, plus:
#   /usr/local/bin/tfinit                        the static binary (needs no libc, no shell)
#   /opt/tfinit/bin/terraform -> tfinit          the shim, first on PATH: the controller's `terraform`
#                                                runs through tfinit, which starts the next
#                                                `terraform` on PATH (the image's real one) as its child
#   ENTRYPOINT ["/usr/local/bin/tfinit", "--"]
# USER, WORKDIR, the other ENV and the files of the base are kept.
#
# CMD: Docker clears an inherited CMD when a Dockerfile sets ENTRYPOINT, and it does not expand
# build args in CMD, so no Dockerfile can keep the base's command by itself. The base's command is
# its ENTRYPOINT followed by its CMD (provider-terraform: ENTRYPOINT ["crossplane-terraform-provider"],
# no CMD). scripts/build-image.sh reads both with `docker image inspect` and adds them as CMD. By
# hand: add `CMD ["crossplane-terraform-provider"]` after the ENTRYPOINT of the stage you build, or,
# in Kubernetes, set the container's `command` (examples/kubernetes/ does).
#
# Targets (the two final stages must stay identical but for where tfinit is copied from;
# tests/examples.rs checks it):
#   image           (default) tfinit compiled from this repository in a Rust builder stage.
#                   Needs BuildKit (the default builder since Docker 23): the legacy builder
#                   (DOCKER_BUILDKIT=0, or a docker CLI without buildx) builds every stage before the
#                   target, including image-prebuilt, which needs the prebuilt binary.
#   image-prebuilt  tfinit from target/x86_64-unknown-linux-gnu/release/tfinit: run
#                   `cargo build --release` first. Pulls nothing but BASE_IMAGE; works with the legacy
#                   builder. `scripts/build-image.sh --prebuilt` uses it.
#
# Only linux/amd64 for now: .cargo/config.toml builds x86_64-unknown-linux-gnu (static glibc).

# The image whose controller tfinit will run. Required: there is no sensible default.
ARG BASE_IMAGE
# The Rust toolchain that compiles tfinit in the default target.
ARG RUST_IMAGE=rust:1.95-bookworm

# ---- tfinit built on the host (cargo build --release) ------------------------------------------
FROM ${BASE_IMAGE} AS image-prebuilt
COPY docker/overlay/ /
COPY target/x86_64-unknown-linux-gnu/release/tfinit /usr/local/bin/tfinit
# The shim's directory first; the base's PATH after it (Docker's default when the base has none).
ENV PATH=/opt/tfinit/bin:${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
ENTRYPOINT ["/usr/local/bin/tfinit", "--"]

# ---- tfinit compiled here -----------------------------------------------------------------------
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# .cargo/config.toml makes the binary static (crt-static, no PIE); --version proves it runs.
RUN cargo build --release --locked --bin tfinit \
 && install -D -m 0755 target/x86_64-unknown-linux-gnu/release/tfinit /tfinit \
 && /tfinit --version

FROM ${BASE_IMAGE} AS image
COPY docker/overlay/ /
COPY --from=build /tfinit /usr/local/bin/tfinit
# The shim's directory first; the base's PATH after it (Docker's default when the base has none).
ENV PATH=/opt/tfinit/bin:${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
ENTRYPOINT ["/usr/local/bin/tfinit", "--"]
