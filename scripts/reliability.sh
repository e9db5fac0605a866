#!/usr/bin/env bash
# Regenerates docs/reliability.md: chaos rounds (tfinit and tini), 10 minutes of fuzzing per
# target, and the load and bad-input figures (the tests of tests/load.rs and tests/bad_input_peers.rs
# print them). Takes about 90 minutes. Usage: scripts/reliability.sh [CHAOS_ROUNDS]   (default 50)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-50}
scripts/chaos.sh "$rounds"
scripts/fuzz.sh long
log=$(mktemp)
cargo test --quiet --test load --test bad_input_peers -- --nocapture --test-threads=1 2>"$log" >/dev/null
python3 - "$log" docs/reliability.md <<'PY'
import datetime, os, sys
log, doc = sys.argv[1], sys.argv[2]
lines = [l.strip() for l in open(log) if l.startswith(("load: ", "bad_input: "))]
start, end = "<!-- load:start -->", "<!-- load:end -->"
body = [start, "Measured %s by `scripts/reliability.sh` (`cargo test --test load --test bad_input_peers`, debug build, "
        "%d cores); each line is what a test printed after its assertions passed:" % (datetime.date.today(), os.cpu_count() or 0), ""]
body += ["- %s" % l for l in lines] + [end]
text = open(doc).read()
pre, rest = text.split(start, 1)
_, post = rest.split(end, 1)
open(doc, "w").write(pre + "\n".join(body) + post)
PY
rm -f "$log"
echo "reliability.sh: docs/reliability.md rewritten"
