#!/usr/bin/env python3
"""Writes the chaos table into docs/reliability.md (between the chaos markers) from the JSON
results of scripts/chaos.py for tfinit and tini. Usage: chaos-report.py TFINIT.json TINI.json DOC"""
import datetime
import json
import os
import platform
import sys

START, END = "<!-- chaos:start -->", "<!-- chaos:end -->"


def main():
    tf, ti, doc = sys.argv[1:4]
    a, b = json.load(open(tf)), json.load(open(ti))
    rows = [
        ("rounds", "rounds"),
        ("SIGTERM, grace long enough (25-30 s)", "sigterm_long"),
        ("SIGTERM, grace too short (4-7 s)", "sigterm_short"),
        ("SIGKILL (node loss)", "sigkill"),
        ("next pod reconciled within TTL + retry + apply", "reconciled_in_bound"),
        ("stuck locks (left after the next pod's attempts)", "stuck_locks"),
        ("orphans (created outside the state)", "orphans"),
        ("orphans named by the init (orphan_candidates in its log)", "orphans_flagged"),
        ("lost (in the state, not in the world)", "lost"),
        ("init crashes", "init_crashes"),
        ("rounds with zombies left", "zombies"),
        ("lock-owner records left behind", "records_left"),
        ("rounds not reconciled (applies lost)", "applies_lost_to_shutdown"),
    ]
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    lines = [START, "",
             "Measured %s on %s (%d cores, %s, kernel %s) by `scripts/chaos.sh %d`: terraform 1.0.3, "
             "null provider 2.1.2, S3+DynamoDB on moto, TFINIT_OWNER_TTL=3s, each round a pod killed at a "
             "random moment while 3 resources are being created, then the next pod on the same workspace."
             % (datetime.date.today().isoformat(), platform.node(), os.cpu_count() or 0, cpu,
                platform.release(), a["rounds"]),
             "", "| | tfinit | tini |", "|---|---:|---:|"]
    for label, key in rows:
        lines.append("| %s | %s | %s |" % (label, a.get(key, "-"), b.get(key, "-")))
    lines += ["", END]
    text = open(doc).read() if os.path.exists(doc) else "# Reliability\n\n## Chaos\n\n"
    if START in text and END in text:
        pre, rest = text.split(START, 1)
        _, post = rest.split(END, 1)
        text = pre + "\n".join(lines) + post
    else:
        text = text.rstrip() + "\n\n## Chaos\n\n" + "\n".join(lines) + "\n"
    open(doc, "w").write(text)


if __name__ == "__main__":
    main()
