#!/usr/bin/env bash
# Fails unless the given binary is statically linked and under the size budget (2.5 MiB, the
# project's limit: DEVELOPERS' "under 2.5 MiB").
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
if [ "$size" -ge $((5 * 1024 * 1024 / 2)) ]; then
  echo "check-static: $bin is $size bytes, over the 2.5 MiB budget" >&2; exit 1
fi
