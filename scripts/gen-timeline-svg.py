#!/usr/bin/env python3
"""Draws tfinit's shutdown timeline as docs/timeline.svg.

    scripts/gen-timeline-svg.py            # (re)writes docs/timeline.svg
    scripts/gen-timeline-svg.py --check    # exit 1 if docs/timeline.svg is not what this draws
    scripts/gen-timeline-svg.py --stdout   # print the SVG

The steps come from src/init/shutdown.rs (deadline = first SIGTERM + TFINIT_GRACE_PERIOD; one
SIGTERM per run at deadline - TFINIT_STOP_TIMEOUT; SIGKILL at deadline - TFINIT_KILL_MARGIN) with
the defaults of src/config.rs; the part after SIGTERM is drawn to scale. The preStop hook before it
is not (it lasts as long as its --timeout allows). Standard library only; the output is
deterministic, so tests/docs.rs can check that the committed picture is current.
"""

import sys
from pathlib import Path

GRACE, STOP, MARGIN = 30, 10, 2  # seconds: src/config.rs DEFAULT_GRACE / _STOP_TIMEOUT / _KILL_MARGIN

WIDTH = 960
LEFT = 150  # lane labels to the left of this
PRESTOP_W = 170  # width of the preStop part (not to scale)
T0 = LEFT + PRESTOP_W  # x of SIGTERM
SCALE = (WIDTH - 40 - T0) / GRACE  # pixels per second after SIGTERM
LANE_H = 58
TOP = 106

COLORS = {
    "prestop": "#d9d9d9",
    "run": "#8cc4e8",
    "wait": "#b7dfb0",
    "graceful": "#f6c987",
    "kill": "#ec8f8f",
    "refused": "#eeeeee",
    "ink": "#222222",
    "muted": "#555555",
}


def x_at(seconds):
    return T0 + seconds * SCALE


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Svg:
    def __init__(self):
        self.parts = []

    def add(self, s):
        self.parts.append(s)

    def rect(self, x1, y, x2, h, fill, label=None, size=12, stroke="none"):
        self.add(
            f'<rect x="{x1:.1f}" y="{y:.1f}" width="{x2 - x1:.1f}" height="{h:.1f}" '
            f'rx="4" fill="{fill}" stroke="{stroke}"/>'
        )
        if label:
            self.text((x1 + x2) / 2, y + h / 2 + size / 3, label, size=size, anchor="middle")

    def text(self, x, y, s, size=12, anchor="start", weight="normal", fill=COLORS["ink"]):
        self.add(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" fill="{fill}">{esc(s)}</text>'
        )

    def line(self, x1, y1, x2, y2, color=COLORS["ink"], width=1.5, dash=None, arrow=False):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        a = ' marker-end="url(#arrow)"' if arrow else ""
        self.add(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{color}" stroke-width="{width}"{d}{a}/>'
        )


def draw():
    lanes = ["kubelet / docker", "tfinit (PID 1)", "controller", "a terraform run", "new runs"]
    height = TOP + LANE_H * len(lanes) + 120
    s = Svg()
    s.add(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif">'
    )
    s.add(
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        f'fill="{COLORS["ink"]}"/></marker></defs>'
    )
    s.add(f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>')
    s.text(20, 30, "tfinit's shutdown timeline", size=18, weight="bold")
    s.text(
        20,
        52,
        f"defaults: TFINIT_GRACE_PERIOD={GRACE}s, TFINIT_STOP_TIMEOUT={STOP}s, "
        f"TFINIT_KILL_MARGIN={MARGIN}s; after SIGTERM drawn to scale",
        size=12,
        fill=COLORS["muted"],
    )

    t_graceful, t_kill, t_end = GRACE - STOP, GRACE - MARGIN, GRACE
    # Time markers: vertical lines through all lanes.
    y_top, y_bottom = TOP - 14, TOP + LANE_H * len(lanes) - 6
    for t, label in [
        (None, "pod deleted"),
        (0, "SIGTERM (t=0)"),
        (t_graceful, f"t={t_graceful}s"),
        (t_kill, f"t={t_kill}s SIGKILL"),
        (t_end, f"t={t_end}s deadline"),
    ]:
        x = LEFT + 4 if t is None else x_at(t)
        s.line(x, y_top, x, y_bottom, color="#999999", width=1, dash="4 3")
        anchor = "end" if t == t_end else ("start" if t is None else "middle")
        # The kill and the deadline are close: the kill's label goes one row up.
        s.text(x, y_top - (20 if t == t_kill else 6), label, size=11, anchor=anchor, fill=COLORS["muted"])

    def lane_y(i):
        return TOP + i * LANE_H

    for i, name in enumerate(lanes):
        s.text(16, lane_y(i) + 24, name, size=13, weight="bold")
        s.line(16, lane_y(i) + LANE_H - 8, WIDTH - 20, lane_y(i) + LANE_H - 8, color="#eeeeee", width=1)

    bar_h = 28
    pre = (LEFT + 4, T0)

    # kubelet
    y = lane_y(0)
    s.rect(pre[0], y + 6, pre[1], bar_h, COLORS["prestop"], "preStop: tfinit drain --wait", size=11)
    s.rect(T0, y + 6, x_at(t_end), bar_h, "#f3f3f3", "waits terminationGracePeriodSeconds, then SIGKILL", size=11)

    # tfinit
    y = lane_y(1)
    s.rect(pre[0], y + 6, pre[1], bar_h, COLORS["prestop"], "draining", size=11)
    s.rect(T0, y + 6, x_at(t_graceful), bar_h, COLORS["wait"], "stopping: runs go on undisturbed", size=11)
    s.rect(x_at(t_graceful), y + 6, x_at(t_kill), bar_h, COLORS["graceful"], "one SIGTERM per run", size=11)
    s.rect(x_at(t_kill), y + 6, x_at(t_end), bar_h, COLORS["kill"], None)
    s.text(x_at(t_kill) + 3, y + 6 + bar_h + 12, "SIGKILL all", size=10, fill=COLORS["muted"])

    # controller
    y = lane_y(2)
    s.rect(pre[0], y + 6, T0, bar_h, COLORS["run"], "reconciling; sees results", size=11)
    s.line(T0, y + 20, T0 + 60, y + 20, arrow=True)
    s.text(T0 + 66, y + 24, "gets SIGTERM (its group), cancels its terraform (the shim), exits", size=11)

    # terraform run
    y = lane_y(3)
    s.rect(pre[0], y + 6, x_at(t_graceful), bar_h, COLORS["run"], "apply keeps running (output logged once the shim is gone)", size=11)
    s.rect(x_at(t_graceful), y + 6, x_at(t_kill), bar_h, COLORS["graceful"], "saves state, unlocks", size=11)
    s.rect(x_at(t_kill), y + 6, x_at(t_end), bar_h, COLORS["kill"], None)

    # new runs
    y = lane_y(4)
    s.rect(pre[0], y + 6, x_at(t_end), bar_h, COLORS["refused"], "refused: the shim exits 75 (EX_TEMPFAIL), the controller requeues", size=11, stroke="#cccccc")

    # Notes under the lanes.
    y = lane_y(len(lanes)) + 18
    notes = [
        "tfinit exits as soon as the controller and every run are gone, with the controller's exit code: usually long before the deadline.",
        "The kubelet counts the preStop hook in the grace period; tfinit's clock starts at SIGTERM:",
        "    terminationGracePeriodSeconds >= drain --timeout + TFINIT_GRACE_PERIOD + a margin (docs/how-it-works.md).",
        "A second SIGTERM jumps to the graceful step, a third to the kill step. Without a preStop hook the timeline starts at SIGTERM.",
    ]
    for i, n in enumerate(notes):
        s.text(20, y + i * 20, n, size=12, fill=COLORS["muted"])
    s.add("</svg>")
    return "\n".join(s.parts) + "\n"


def main(argv):
    out = Path(__file__).resolve().parent.parent / "docs" / "timeline.svg"
    svg = draw()
    if "--stdout" in argv:
        sys.stdout.write(svg)
        return 0
    if "--check" in argv:
        current = out.read_text() if out.exists() else ""
        if current != svg:
            print(f"{out} is out of date: run scripts/gen-timeline-svg.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(svg)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
