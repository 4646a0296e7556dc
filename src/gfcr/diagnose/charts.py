"""Inline SVG charts for the report: line charts over steps and stacked bars, with round ticks.

Hand-written SVG (no plotting dependency, a few kB per chart, text kept as text so a browser test
can read the tick labels). What a reader needs at a glance, and what each function guarantees:

* **round ticks** — :func:`nice_ticks` picks 1, 2, 2.5 or 5 × 10^k steps (Heckbert's "nice
  numbers", Graphics Gems 1990), so axes read 0, 0.25, 0.5 … never 0.0625, 0.281;
* **every step labelled** when there are at most :data:`MAX_X_LABELS` steps, else round integer
  ticks;
* **markers and dashes** — each series has its own colour (Okabe–Ito, colour-blind safe), dash
  pattern and marker, so identical series stay visible on top of each other; each point carries a
  ``<title>`` tooltip with its value;
* **axis labels** on both axes and titles wrapped to the chart's width.

All labels are escaped: series names and titles may come from a store.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np

#: Okabe & Ito (2008) colour-blind-safe palette, without yellow (too light on white)
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#56B4E9", "#E69F00", "#000000"]
DASHES = ["", "6 3", "2 3", "8 3 2 3", "4 2 1 2"]
MARKERS = ["circle", "square", "triangle", "diamond", "cross"]
MAX_X_LABELS = 12
WIDTH, HEIGHT = 400, 250
LEFT, RIGHT, BOTTOM = 58, 14, 40
CHAR_W = 7.2  # approximate advance of a 13 px bold sans-serif glyph, for title wrapping
LEGEND_CHAR_W = 6.0  # the same for an 11 px legend label


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def nice_step(span: float, target: int = 5) -> float:
    """A round tick step (1, 2, 2.5 or 5 × 10^k) giving about ``target`` intervals over ``span``.

    Examples: ``nice_step(1.0) = 0.2``; ``nice_step(0.392) = 0.1``; ``nice_step(37) = 10``.
    """
    if not math.isfinite(span) or span <= 0:
        return 1.0
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag * (1 + 1e-9):
            return m * mag
    return 10 * mag


def nice_ticks(lo: float, hi: float, target: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering ``[lo, hi]``: the first ≤ lo, the last ≥ hi.

    ``integer`` keeps steps ≥ 1 and whole (steps, counts). Example: ``nice_ticks(0, 0.392)`` →
    ``[0, 0.1, 0.2, 0.3, 0.4]``; ``nice_ticks(0, 1)`` → ``[0, 0.2, …, 1]``.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi - lo < 1e-12:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step(hi - lo, target)
    if integer and not float(step).is_integer():
        step = max(1.0, float(math.floor(step)))  # 0.5 → 1, 2.5 → 2
    start = math.floor(lo / step + 1e-9) * step
    ticks = []
    v = start
    while v < hi + step * 0.5 and len(ticks) < 50:
        ticks.append(round(v, 12))
        if v >= hi - 1e-12:
            break
        v += step
    if ticks[-1] < hi - 1e-12:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def tick_label(v: float, step: float) -> str:
    """``v`` with as many decimals as the tick ``step`` needs (0.25 → 2, 0.2 → 1, 10 → 0)."""
    if step >= 1 and float(step).is_integer():
        decimals = 0
    else:
        decimals = max(0, -math.floor(math.log10(step) + 1e-9))
        if round(step * 10**decimals, 6) % 1:
            decimals += 1
    s = f"{v:.{decimals}f}"
    return "0" if s.strip("-0.") == "" else s


def wrap(text: str, width_px: float, char_w: float = CHAR_W) -> list[str]:
    """Greedy word wrap of ``text`` to lines of at most ``width_px`` (estimated glyph width)."""
    per = max(8, int(width_px / char_w))
    lines: list[str] = []
    cur = ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > per:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        lines.append(cur)
    return lines or [""]


def _marker(kind: str, x: float, y: float, colour: str, tip: str) -> str:
    t = f"<title>{_e(tip)}</title>" if tip else ""
    if kind == "square":
        return f'<rect x="{x - 3:.1f}" y="{y - 3:.1f}" width="6" height="6" fill="{colour}">{t}</rect>'
    if kind == "triangle":
        return f'<polygon points="{x:.1f},{y - 4:.1f} {x - 3.6:.1f},{y + 2.6:.1f} {x + 3.6:.1f},{y + 2.6:.1f}" fill="{colour}">{t}</polygon>'
    if kind == "diamond":
        return f'<polygon points="{x:.1f},{y - 4:.1f} {x + 4:.1f},{y:.1f} {x:.1f},{y + 4:.1f} {x - 4:.1f},{y:.1f}" fill="{colour}">{t}</polygon>'
    if kind == "cross":
        return (f'<path d="M{x - 3:.1f},{y - 3:.1f}L{x + 3:.1f},{y + 3:.1f}M{x - 3:.1f},{y + 3:.1f}L{x + 3:.1f},{y - 3:.1f}" '
                f'stroke="{colour}" stroke-width="1.8">{t}</path>')
    # the first series: a larger open ring, so a later series on the same values shows inside it
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="#fff" stroke="{colour}" stroke-width="1.8">{t}</circle>'


def _fmt_value(v: float) -> str:
    return f"{v:.4g}"


class _Frame:
    """Plot-area geometry and the axes of one chart (x: steps, y: values)."""

    def __init__(self, title: str, x: np.ndarray, y_lo: float, y_hi: float, names: Sequence[str], integer_y: bool,
                 width: int = WIDTH, height: int = HEIGHT):
        self.title_lines = wrap(title, width - 12)
        self.width = width
        self.top = 10 + 16 * len(self.title_lines) + 6
        longest = max((len(n) for n in names), default=0)
        self.legend_cols = 2 if longest * LEGEND_CHAR_W < (width - LEFT - 8) / 2 - 26 else 1
        self.legend_rows = math.ceil(len(names) / self.legend_cols) if names else 0
        self.height = height + 16 * max(0, len(self.title_lines) - 1) + 15 * max(0, self.legend_rows - 1)
        self.pw = width - LEFT - RIGHT
        self.ph = self.height - self.top - BOTTOM - 15 * self.legend_rows
        xs = x[np.isfinite(x)]
        self.x0, self.x1 = (float(xs.min()), float(xs.max())) if len(xs) else (0.0, 1.0)
        if self.x1 <= self.x0:
            self.x0, self.x1 = self.x0 - 0.5, self.x0 + 0.5
        self.steps = sorted({float(v) for v in xs})
        self.yt = nice_ticks(y_lo, y_hi, 5, integer=integer_y)
        self.y0, self.y1 = self.yt[0], self.yt[-1]

    def px(self, v: float) -> float:
        pad = 8
        return LEFT + pad + (v - self.x0) / (self.x1 - self.x0) * (self.pw - 2 * pad)

    def py(self, v: float) -> float:
        return self.top + self.ph - (v - self.y0) / (self.y1 - self.y0) * self.ph

    def open(self, title: str, y_label: str) -> list[str]:
        w, h = self.width, self.height
        out = [f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{_e(title)}" '
               f'font-family="system-ui,-apple-system,Segoe UI,Roboto,sans-serif">']
        for i, line in enumerate(self.title_lines):
            out.append(f'<text class="title" x="6" y="{20 + 16 * i}" font-size="13" font-weight="600">{_e(line)}</text>')
        ystep = self.yt[1] - self.yt[0] if len(self.yt) > 1 else 1.0
        for v in self.yt:
            y = self.py(v)
            out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + self.pw}" y2="{y:.1f}" stroke="#e8e8e8"/>')
            out.append(f'<text class="tick ytick" x="{LEFT - 5}" y="{y + 3.5:.1f}" font-size="10" text-anchor="end" '
                       f'fill="#444">{tick_label(v, ystep)}</text>')
        base = self.top + self.ph
        out.append(f'<line x1="{LEFT}" y1="{base}" x2="{LEFT + self.pw}" y2="{base}" stroke="#888"/>')
        out.append(f'<line x1="{LEFT}" y1="{self.top}" x2="{LEFT}" y2="{base}" stroke="#888"/>')
        if len(self.steps) <= MAX_X_LABELS:
            xt = self.steps
        else:
            xt = [v for v in nice_ticks(self.x0, self.x1, 8, integer=True) if self.x0 - 1e-9 <= v <= self.x1 + 1e-9]
        for v in xt:
            x = self.px(v)
            out.append(f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}" stroke="#888"/>')
            out.append(f'<text class="tick xtick" x="{x:.1f}" y="{base + 15}" font-size="10" text-anchor="middle" '
                       f'fill="#444">{int(round(v))}</text>')
        out.append(f'<text class="axis-label" x="{LEFT + self.pw / 2:.1f}" y="{base + 29}" font-size="11" '
                   f'text-anchor="middle" fill="#333">step</text>')
        cy = self.top + self.ph / 2
        out.append(f'<text class="axis-label" x="13" y="{cy:.1f}" font-size="11" text-anchor="middle" fill="#333" '
                   f'transform="rotate(-90 13 {cy:.1f})">{_e(y_label)}</text>')
        return out

    def legend(self, i: int, name: str, colour: str, dash: str, marker: str, bar: bool = False) -> str:
        cols = self.legend_cols
        col_w = (self.width - LEFT - 8) / cols
        x = LEFT + (i % cols) * col_w
        y = self.top + self.ph + BOTTOM + 15 * (i // cols)
        if bar:
            sample = f'<rect x="{x:.1f}" y="{y - 8}" width="18" height="9" fill="{colour}"/>'
        else:
            sample = (f'<line x1="{x:.1f}" y1="{y - 4}" x2="{x + 18:.1f}" y2="{y - 4}" stroke="{colour}" stroke-width="2" '
                      f'stroke-dasharray="{dash}"/>' + _marker(marker, x + 9, y - 4, colour, ""))
        label = name if len(name) * LEGEND_CHAR_W < col_w - 26 else name[: int((col_w - 26) / LEGEND_CHAR_W) - 1] + "…"
        return f'<g class="legend-item">{sample}<text x="{x + 23:.1f}" y="{y}" font-size="11">{_e(label)}<title>{_e(name)}</title></text></g>'


def line_chart(title: str, x: Sequence[float], series: dict[str, Sequence[float]], y_label: str,
               y_range: tuple[float | None, float | None] = (None, None), integer_y: bool = False) -> str:
    """An inline SVG line chart of ``series`` (name → ``[N]``) over steps ``x`` ``[N]``.

    NaN breaks a line; a point between gaps shows as its marker. ``y_range`` fixes either end
    (shares use ``(0, 1)``); the axis then still extends to round ticks covering the data.
    Returns ``""`` when nothing is finite.
    """
    xs = np.asarray(x, float)
    ys = {k: np.asarray(v, float) for k, v in series.items()}
    finite = np.concatenate([v[np.isfinite(v)] for v in ys.values()]) if ys else np.zeros(0)
    if len(xs) == 0 or len(finite) == 0:
        return ""
    lo = min(float(finite.min()), 0.0) if y_range[0] is None else min(y_range[0], float(finite.min()))
    hi = float(finite.max()) if y_range[1] is None else max(y_range[1], float(finite.max()))
    f = _Frame(title, xs, lo, hi, list(ys), integer_y)
    out = f.open(title, y_label)
    show_markers = len(xs) <= 60
    for i, (name, v) in enumerate(ys.items()):
        colour, dash, mk = PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)], MARKERS[i % len(MARKERS)]
        run: list[tuple[float, float, float, float]] = []
        runs = []
        for xv, yv in zip(xs, v, strict=True):
            if np.isfinite(yv) and np.isfinite(xv):
                run.append((f.px(xv), f.py(yv), xv, yv))
            elif run:
                runs.append(run)
                run = []
        if run:
            runs.append(run)
        g = [f'<g class="series" data-series="{_e(name)}">']
        for r in runs:
            if len(r) > 1:
                pts = " ".join(f"{a:.1f},{b:.1f}" for a, b, _, _ in r)
                width = 3.5 if i == 0 and len(ys) > 1 else 2  # a wide first line stays visible under the others
                g.append(f'<polyline fill="none" stroke="{colour}" stroke-width="{width}" stroke-dasharray="{dash}" '
                         f'stroke-linejoin="round" stroke-opacity="{0.8 if width > 2 else 1}" points="{pts}"/>')
            if show_markers or len(r) == 1:
                g.extend(_marker(mk, a, b, colour, f"{name} · step {int(xv)}: {_fmt_value(yv)}") for a, b, xv, yv in r)
        g.append("</g>")
        out.extend(g)
        out.append(f.legend(i, name, colour, dash, mk))
    out.append("</svg>")
    return "".join(out)


def stacked_bar_chart(title: str, x: Sequence[float], series: dict[str, Sequence[float]], y_label: str) -> str:
    """An inline SVG stacked bar chart of non-negative counts per step (NaN counts as 0).
    Returns ``""`` when every value is NaN or zero."""
    xs = np.asarray(x, float)
    ys = {k: np.nan_to_num(np.asarray(v, float)) for k, v in series.items()}
    if len(xs) == 0 or not ys:
        return ""
    totals = np.sum(list(ys.values()), axis=0)
    if not np.any(totals > 0):
        return ""
    f = _Frame(title, xs, 0.0, float(totals.max()), list(ys), integer_y=True)
    out = f.open(title, y_label)
    gap = (f.pw - 16) / max(1, (f.x1 - f.x0)) if len(f.steps) > 1 else f.pw / 2
    bw = max(2.0, min(28.0, gap * 0.7))
    bottom = np.zeros(len(xs))
    for i, (name, v) in enumerate(ys.items()):
        colour = PALETTE[i % len(PALETTE)]
        g = [f'<g class="series" data-series="{_e(name)}">']
        for j, (xv, yv) in enumerate(zip(xs, v, strict=True)):
            if yv <= 0 or not np.isfinite(xv):
                continue
            y_top, y_bot = f.py(bottom[j] + yv), f.py(bottom[j])
            g.append(f'<rect x="{f.px(xv) - bw / 2:.1f}" y="{y_top:.1f}" width="{bw:.1f}" height="{y_bot - y_top:.1f}" '
                     f'fill="{colour}"><title>{_e(name)} · step {int(xv)}: {_fmt_value(yv)}</title></rect>')
        g.append("</g>")
        out.extend(g)
        bottom = bottom + v
        out.append(f.legend(i, name, colour, "", "", bar=True))
    out.append("</svg>")
    return "".join(out)


__all__ = ["line_chart", "stacked_bar_chart", "nice_ticks", "nice_step", "tick_label", "wrap"]
