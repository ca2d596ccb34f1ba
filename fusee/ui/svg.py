"""Inline SVG drawn on the server: the run timeline and the metrics charts (no script needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from fusee.ui import present
from fusee.ui.timeline import Operation, Timeline

#: The colour of each status, shared by badges (ui.css) and charts.
STATUS_COLORS = {
    "ok": "#16a34a",
    "running": "#2563eb",
    "failed": "#dc2626",
    "retrying": "#f59e0b",
    "paused": "#d97706",
    "cancelled": "#6b7280",
    "terminated": "#475569",
    "timed_out": "#ea580c",
    "stuck": "#b91c1c",
    "continued": "#0891b2",
    "abandoned": "#9ca3af",
}
MARK_COLORS = {"signal": "#7c3aed", "update": "#0d9488", "cancel": "#6b7280", "resume": "#d97706",
               "send": "#db2777"}


def color(status: str) -> str:
    return STATUS_COLORS.get(status, "#64748b")


def _a(value: object) -> str:
    return escape(str(value), quote=True)


LABEL_W = 230
LANE_H = 26
#: Operations drawn as lanes (the steps table lists them all).
MAX_LANES = 150
#: The widest the journal's axis gets, in pixels.
MAX_PLOT_W = 3600


#: The width of the time axis of a waterfall, in pixels.
WATERFALL_W = 900
#: The narrowest bar of a waterfall (an instant step stays visible).
MIN_BAR_W = 2.0


def timeline(tl: Timeline, run_url: str) -> str:
    """The run's operations as bars over its journal, and what came from outside as marks.

    A journal that times its operations is drawn as a waterfall on a time axis
    (:func:`waterfall`); one written before step times over the journal's order.
    ``run_url`` is the URL of a run page without its ID (children's lanes link there).
    """
    if tl.timed:
        return waterfall(tl, run_url)
    n = max(tl.length, 1)
    # Columns of 6 px at least, down to a total of MAX_PLOT_W for a long journal.
    cw = min(90.0, max(780 / n, min(6.0, MAX_PLOT_W / n)))
    width = LABEL_W + n * cw + 16
    ops = tl.operations[:MAX_LANES]
    hidden = len(tl.operations) - len(ops)
    top = 34
    marks_y = top
    lanes_y = top + LANE_H + 6
    height = lanes_y + (max(1, len(ops)) + (1 if hidden else 0)) * LANE_H + 10

    def x(i: float) -> float:
        return LABEL_W + i * cw

    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height}" viewBox="0 0 {width:.0f} {height}" role="img" '
           f'aria-label="timeline of {len(tl.operations)} operations">']
    # The axis: journal positions, with the run's start and end times where known.
    step = _nice(max(1.0, 48 / cw))
    for i in range(0, n, int(step)):
        out.append(f'<line x1="{x(i):.1f}" y1="{top - 6}" x2="{x(i):.1f}" y2="{height - 6}" class="grid"/>')
        out.append(f'<text x="{x(i) + 2:.1f}" y="{top - 10}" class="tick">#{i}</text>')
    out.append(f'<text x="8" y="{top - 10}" class="axis-title">journal order →</text>')
    # Marks: signals, updates, cancels, resumes and sent signals.
    out.append(f'<text x="8" y="{marks_y + 17}" class="lane-label muted">signals, updates, cancels</text>')
    out.append(f'<rect x="{LABEL_W}" y="{marks_y + 2}" width="{n * cw:.1f}" height="{LANE_H - 4}" class="lane-bg"/>')
    for m in tl.marks:
        cx, cy, r = x(m.index) + cw / 2, marks_y + LANE_H / 2, min(7.0, cw / 2 + 1)
        fill = MARK_COLORS.get(m.kind, "#64748b")
        out.append(
            f'<g class="mark mark-{_a(m.kind)}"><title>{_a(m.label)} (record {m.index}) {_a(m.detail)}</title>'
            f'<path d="M{cx:.1f} {cy - r:.1f} L{cx + r:.1f} {cy:.1f} L{cx:.1f} {cy + r:.1f} '
            f'L{cx - r:.1f} {cy:.1f} Z" fill="{fill}"/></g>')
    for k, o in enumerate(ops):
        y = lanes_y + k * LANE_H
        label = f"{o.label} {o.name}"
        text = _a(label if len(label) <= 30 else label[:29] + "…")
        if o.child_id is not None:
            href = _a(run_url + o.child_id)
            text = f'<a href="{href}" class="child-link">{_a("child " + o.child_id)[:60]}</a>'
        out.append(f'<text x="8" y="{y + 17}" class="lane-label" data-op="{_a(o.name)}">{text}</text>')
        if k % 2 == 0:
            out.append(f'<rect x="{LABEL_W}" y="{y + 1}" width="{n * cw:.1f}" height="{LANE_H - 2}" class="lane-bg"/>')
        start = x(o.issued + 1)
        open_end = o.end is None
        end = x((o.end + 1) if o.end is not None else n)
        w = max(end - start, 3.0)
        tip = f"{label}: {o.status}"
        if o.outcome:
            tip += f" — {o.outcome}"
        if o.due:
            tip += f" (due {o.due})"
        if o.attempts:
            tip += f"; {len(o.attempts)} failed attempt(s)"
        cls = f"bar bar-{_a(o.status)}" + (" open" if open_end else "")
        out.append(f'<g class="op" data-status="{_a(o.status)}"><title>{_a(tip)}</title>'
                   f'<rect x="{start:.1f}" y="{y + 5}" width="{w:.1f}" height="{LANE_H - 10}" rx="3" '
                   f'fill="{color(o.status)}" class="{cls}"/></g>')
        for a in o.attempts:
            ax = x(a.index) + cw / 2
            why = f"attempt {a.attempt} failed: {a.error}" + (
                " — paused" if a.paused else f" — retry at {a.retry_at}")
            out.append(f'<g class="attempt"><title>{_a(why)}</title>'
                       f'<line x1="{ax:.1f}" y1="{y + 2}" x2="{ax:.1f}" y2="{y + LANE_H - 2}" '
                       f'stroke="#b91c1c" stroke-width="3"/>'
                       f'<circle cx="{ax:.1f}" cy="{y + 3}" r="3" fill="#b91c1c"/></g>')
    if not ops:
        out.append(f'<text x="{LABEL_W + 6}" y="{lanes_y + 17}" class="muted">no operation journaled yet</text>')
    if hidden:
        y = lanes_y + len(ops) * LANE_H
        out.append(f'<text x="8" y="{y + 17}" class="muted">+ {hidden:,} more operations '
                   '(see the steps table)</text>')
    out.append("</svg>")
    return "".join(out)


def _lane_label(o: Operation, run_url: str, y: float) -> str:
    label = f"{o.label} {o.name}"
    text = _a(label if len(label) <= 30 else label[:29] + "…")
    if o.child_id is not None:
        text = f'<a href="{_a(run_url + o.child_id)}" class="child-link">{_a("child " + o.child_id)[:60]}</a>'
    return f'<text x="8" y="{y + 17}" class="lane-label" data-op="{_a(o.name)}">{text}</text>'


def _tick_label(ms: float) -> str:
    return "0" if ms == 0 else "+" + present.duration(ms)


def waterfall(tl: Timeline, run_url: str) -> str:
    """The run's operations on a time axis from its start: one bar per step attempt (its
    queue delay before it, drawn lighter), sleeps and waits to scale, marks where they came."""
    ops = tl.operations[:MAX_LANES]
    hidden = len(tl.operations) - len(ops)
    t0 = float(tl.started_ms if tl.started_ms is not None else min(tl.times, default=0.0))
    ends = [t for o in tl.operations for t in (o.began_ms, o.ended_ms) if t is not None]
    t1 = max([*ends, *tl.times, float(tl.ended_ms or t0)])
    span_ms = max(t1 - t0, 1.0)
    scale = WATERFALL_W / span_ms
    width = LABEL_W + WATERFALL_W + 24
    top = 34
    marks_y = top
    lanes_y = top + LANE_H + 6
    height = lanes_y + (max(1, len(ops)) + (1 if hidden else 0)) * LANE_H + 10
    right = LABEL_W + WATERFALL_W

    def x(t: float) -> float:
        return LABEL_W + (t - t0) * scale

    out = [f'<svg class="timeline waterfall" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height}" viewBox="0 0 {width:.0f} {height}" role="img" data-ms-per-px="{1 / scale:.6g}" '
           f'aria-label="waterfall of {len(tl.operations)} operations over {_a(present.duration(span_ms))}">']
    tick = _nice(span_ms / 8)
    k = 0
    while k * tick <= span_ms + 1e-9:
        tx = x(t0 + k * tick)
        out.append(f'<line x1="{tx:.1f}" y1="{top - 6}" x2="{tx:.1f}" y2="{height - 6}" class="grid"/>')
        out.append(f'<text x="{tx + 2:.1f}" y="{top - 10}" class="tick">{_a(_tick_label(k * tick))}</text>')
        k += 1
    out.append(f'<text x="8" y="{top - 10}" class="axis-title">time since start →</text>')
    out.append(f'<text x="8" y="{marks_y + 17}" class="lane-label muted">signals, updates, cancels</text>')
    out.append(f'<rect x="{LABEL_W}" y="{marks_y + 2}" width="{WATERFALL_W}" height="{LANE_H - 4}" class="lane-bg"/>')
    for m in tl.marks:
        at = tl.times[m.index] if m.index < len(tl.times) else t0
        cx, cy, r = x(at), marks_y + LANE_H / 2, 6.0
        fill = MARK_COLORS.get(m.kind, "#64748b")
        out.append(
            f'<g class="mark mark-{_a(m.kind)}"><title>{_a(m.label)} (record {m.index}, {_a(present.when(int(at)))}) '
            f'{_a(m.detail)}</title>'
            f'<path d="M{cx:.1f} {cy - r:.1f} L{cx + r:.1f} {cy:.1f} L{cx:.1f} {cy + r:.1f} '
            f'L{cx - r:.1f} {cy:.1f} Z" fill="{fill}"/></g>')
    for k, o in enumerate(ops):
        y = lanes_y + k * LANE_H
        out.append(_lane_label(o, run_url, y))
        if k % 2 == 0:
            out.append(f'<rect x="{LABEL_W}" y="{y + 1}" width="{WATERFALL_W}" height="{LANE_H - 2}" class="lane-bg"/>')
        label = f"{o.label} {o.name}"
        bar_y, bar_h = y + 5, LANE_H - 10
        if o.spans:
            prev_end: float | None = None
            for sp in o.spans:
                if prev_end is not None:
                    # The wait between two attempts (the retry's delay).
                    out.append(f'<line x1="{x(prev_end):.1f}" y1="{y + LANE_H / 2}" x2="{x(sp.began_ms - sp.queued_ms):.1f}" '
                               f'y2="{y + LANE_H / 2}" class="retry-gap"/>')
                if sp.queued_ms > 0:
                    qx = x(sp.began_ms - sp.queued_ms)
                    out.append(f'<g class="queued" data-op="{_a(o.name)}" data-attempt="{sp.attempt}" data-ms="{sp.queued_ms:.3f}">'
                               f'<title>{_a(label)} attempt {sp.attempt} queued {_a(present.duration(sp.queued_ms))} '
                               f'for a permit or a thread</title>'
                               f'<rect x="{qx:.1f}" y="{bar_y + 3}" width="{max(x(sp.began_ms) - qx, 1.0):.2f}" '
                               f'height="{bar_h - 6}" class="queue-bar"/></g>')
                status = "retrying" if sp.status == "retried" else sp.status
                tip = f"{label} attempt {sp.attempt}: {sp.status}, {present.duration(sp.took_ms)}"
                if sp.error:
                    tip += f" — {sp.error}"
                bx = x(sp.began_ms)
                out.append(f'<g class="op attempt-bar" data-status="{_a(sp.status)}" data-attempt="{sp.attempt}" '
                           f'data-op="{_a(o.name)}" data-ms="{sp.took_ms:.3f}"><title>{_a(tip)}</title>'
                           f'<rect x="{bx:.1f}" y="{bar_y}" width="{max(sp.took_ms * scale, MIN_BAR_W):.2f}" '
                           f'height="{bar_h}" rx="2" fill="{color(status)}" class="bar bar-{_a(status)}"/></g>')
                prev_end = sp.ended_ms
            if o.end is None and prev_end is not None:
                # The next attempt is due or under way: not journaled yet.
                out.append(f'<line x1="{x(prev_end):.1f}" y1="{y + LANE_H / 2}" x2="{right:.1f}" '
                           f'y2="{y + LANE_H / 2}" class="retry-gap open"/>')
            continue
        began = o.began_ms if o.began_ms is not None else t0
        open_end = o.end is None
        ended = o.ended_ms if o.ended_ms is not None else t1
        ms = max(ended - began, 0.0)
        tip = f"{label}: {o.status}, {present.duration(ms)}"
        if o.outcome:
            tip += f" — {o.outcome}"
        if o.due:
            tip += f" (due {o.due})"
        cls = f"bar bar-{_a(o.status)}" + (" open" if open_end else "")
        out.append(f'<g class="op" data-status="{_a(o.status)}" data-op="{_a(o.name)}" data-kind="{_a(o.kind)}" '
                   f'data-ms="{ms:.3f}"><title>{_a(tip)}</title>'
                   f'<rect x="{x(began):.1f}" y="{bar_y}" width="{max(ms * scale, MIN_BAR_W):.2f}" height="{bar_h}" '
                   f'rx="3" fill="{color(o.status)}" class="{cls}"/></g>')
    if not ops:
        out.append(f'<text x="{LABEL_W + 6}" y="{lanes_y + 17}" class="muted">no operation journaled yet</text>')
    if hidden:
        y = lanes_y + len(ops) * LANE_H
        out.append(f'<text x="8" y="{y + 17}" class="muted">+ {hidden:,} more operations '
                   '(see the steps table)</text>')
    out.append("</svg>")
    return "".join(out)


def hbars(items: Sequence[tuple[str, float]], width: int = 560) -> str:
    """Horizontal bars, one per (label, value), coloured by status name."""
    bar_h, gap, label_w = 22, 8, 110
    height = max(1, len(items)) * (bar_h + gap) + 6
    top = max((v for _, v in items), default=0) or 1
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}">']
    for k, (label, v) in enumerate(items):
        y = k * (bar_h + gap) + 3
        w = (width - label_w - 60) * v / top
        out.append(f'<text x="0" y="{y + 15}" class="lane-label">{_a(label)}</text>'
                   f'<rect x="{label_w}" y="{y}" width="{max(w, 2):.1f}" height="{bar_h}" rx="3" '
                   f'fill="{color(label)}"/>'
                   f'<text x="{label_w + max(w, 2) + 6:.1f}" y="{y + 15}" class="value">{v:,.0f}</text>')
    if not items:
        out.append('<text x="0" y="16" class="muted">no runs yet</text>')
    out.append("</svg>")
    return "".join(out)


def lines(
    series: Sequence[tuple[str, str, Sequence[tuple[float, float]]]],
    unit: str,
    width: int = 560,
    height: int = 180,
) -> str:
    """A line chart of (label, colour, [(seconds ago <= 0, value)]) series, with a legend."""
    left, right, top, bottom = 46, 10, 10, 38
    pw, ph = width - left - right, height - top - bottom
    xs = [t for _, _, pts in series for t, _ in pts]
    ys = [v for _, _, pts in series for _, v in pts]
    x0 = min(xs, default=-60.0)
    x0 = min(x0, -10.0)
    ymax = 4 * _nice(max(ys, default=0.0) / 4)
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}">']
    for k in range(5):
        v = ymax * k / 4
        y = top + ph - ph * k / 4
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(v)}</text>')
    out.append(f'<text x="{left}" y="{top + ph + 14}" class="tick">{_ago(x0)}</text>'
               f'<text x="{left + pw}" y="{top + ph + 14}" class="tick" text-anchor="end">now</text>'
               f'<text x="{left + pw / 2:.0f}" y="{top + ph + 14}" class="tick" text-anchor="middle">{_a(unit)}</text>')

    def px(t: float) -> float:
        return left + pw * (t - x0) / (0 - x0)

    def py(v: float) -> float:
        return top + ph - ph * v / ymax

    lx = left
    for label, col, pts in series:
        if len(pts) == 1:
            t, v = pts[0]
            out.append(f'<circle cx="{px(t):.1f}" cy="{py(v):.1f}" r="3" fill="{col}"/>')
        elif pts:
            d = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in pts)
            out.append(f'<polyline points="{d}" fill="none" stroke="{col}" stroke-width="2"/>')
        out.append(f'<rect x="{lx}" y="{height - 12}" width="10" height="10" fill="{col}" rx="2"/>'
                   f'<text x="{lx + 14}" y="{height - 3}" class="tick">{_a(label)}</text>')
        lx += 24 + 7 * len(label)
    out.append("</svg>")
    return "".join(out)


def _nice(v: float) -> float:
    """The round number at or above ``v`` an axis ends at."""
    if v <= 0:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(v))
    for f in (1, 2, 2.5, 5, 10):
        if v <= f * mag:
            return float(f * mag)
    return float(10 * mag)


def _fmt(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}" if v >= 1 or v == 0 else f"{v:.2g}"


def _ago(t: float) -> str:
    s = -t
    return f"−{s / 60:.0f} min" if s >= 120 else f"−{s:.0f} s"
