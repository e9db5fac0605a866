#!/usr/bin/env bash
# Fails unless the given binary is statically linked and under the size budget: 3.5 MiB. It was
# 2.5 MiB until issue 24: its Kubernetes API client (src/kube/: HTTPS with rustls and ring, and
# ureq) costs about 1 MB once the Lease store calls it (2.44 MB -> 3.48 MB measured with every
# operation called; Cargo.toml says what each crate costs), and a store that needs no volume is
# worth that; 3.5 MiB leaves the store itself about 180 KB.
set -euo pipefail
bin="${1:-target/x86_64-unknown-linux-gnu/release/tfinit}"
desc=$(file -L "$bin")
echo "$desc"
case "$desc" in
  *"statically linked"*|*"static-pie linked"*) ;;
  *) echo "check-static: $bin is not statically linked: build with cargo build --release (see .cargo/config.toml)" >&2; exit 1 ;;
esac
size=$(stat -c %s "$bin")
echo "size: $size bytes"
if [ "$size" -ge $((7 * 1024 * 1024 / 2)) ]; then
  echo "check-static: $bin is $size bytes, over the 3.5 MiB budget" >&2; exit 1
fi
