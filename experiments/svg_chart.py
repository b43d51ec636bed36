"""Plots of the records as SVG text, written by ``experiments/report.py`` like its tables.

Plain SVG from the standard library: the same records give the same bytes on every machine (no plotting library,
no font metrics, no dates in the file), so ``report.py --check`` can hold a plot to its records as it holds a table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 640, 360
LEFT, RIGHT, TOP, BOTTOM = 64, 170, 40, 56  # the margins around the plot area
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


@dataclass(frozen=True)
class Point:
    x: float
    mean: float
    sd: float | None  # None for one value: no whisker


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[Point]


def nice_step(span: float, ticks: int = 5) -> float:
    """A 1, 2 or 5 times a power of ten that cuts ``span`` into about ``ticks`` intervals."""
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def fmt(v: float) -> str:
    return f"{v:.1f}"


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, log2_x: bool = False,
               empty: str = "No record yet.") -> str:
    """Each series as a line through its means, a dot at each and a whisker of ± its sd; x ticks at the points'
    x values, on a log2 axis with ``log2_x``."""
    header = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
              f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">\n'
              f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>\n'
              f'<text x="{WIDTH / 2:.0f}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>\n')
    points = [p for s in series for p in s.points]
    if not points:
        return header + f'<text x="{WIDTH / 2:.0f}" y="{HEIGHT / 2:.0f}" text-anchor="middle">{escape(empty)}</text>\n</svg>\n'

    def xv(x: float) -> float:
        return math.log2(x) if log2_x else x

    xs = sorted({p.x for p in points})
    lows = [p.mean - (p.sd or 0) for p in points]
    highs = [p.mean + (p.sd or 0) for p in points]
    step = nice_step(max(max(highs) - min(lows), 1e-9))
    y0, y1 = math.floor(min(lows) / step) * step, math.ceil(max(highs) / step) * step
    if y1 == y0:
        y1 = y0 + step
    x0, x1 = xv(xs[0]), xv(xs[-1])
    pad = 0.05 * (x1 - x0) if x1 > x0 else 0.5
    x0, x1 = x0 - pad, x1 + pad
    width, height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (xv(x) - x0) / (x1 - x0) * width

    def py(y: float) -> float:
        return TOP + (y1 - y) / (y1 - y0) * height

    out = [header, f'<rect x="{LEFT}" y="{TOP}" width="{width}" height="{height}" fill="none" stroke="#888"/>\n']
    decimals = max(0, -math.floor(math.log10(step)))
    for i in range(round((y1 - y0) / step) + 1):
        y = y0 + i * step
        out.append(f'<line x1="{LEFT}" y1="{fmt(py(y))}" x2="{LEFT + width}" y2="{fmt(py(y))}" stroke="#eee"/>\n'
                   f'<text x="{LEFT - 6}" y="{fmt(py(y) + 4)}" text-anchor="end">{y:.{decimals}f}</text>\n')
    for x in xs:
        out.append(f'<text x="{fmt(px(x))}" y="{TOP + height + 18}" text-anchor="middle">{x:g}</text>\n')
    out.append(f'<text x="{LEFT + width / 2:.0f}" y="{HEIGHT - 14}" text-anchor="middle">{escape(x_label)}</text>\n'
               f'<text x="16" y="{TOP + height / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + height / 2:.0f})">{escape(y_label)}</text>\n')
    for i, s in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        ordered = sorted(s.points, key=lambda p: p.x)
        if len(ordered) > 1:
            path = " ".join(f"{fmt(px(p.x))},{fmt(py(p.mean))}" for p in ordered)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>\n')
        for p in ordered:
            if p.sd:
                out.append(f'<line x1="{fmt(px(p.x))}" y1="{fmt(py(p.mean - p.sd))}" x2="{fmt(px(p.x))}" '
                           f'y2="{fmt(py(p.mean + p.sd))}" stroke="{colour}"/>\n')
            out.append(f'<circle cx="{fmt(px(p.x))}" cy="{fmt(py(p.mean))}" r="3.5" fill="{colour}">'
                       f'<title>{escape(s.label)}, {p.x:g}: {p.mean:.2f}'
                       f'{f" ± {p.sd:.2f}" if p.sd is not None else ""}</title></circle>\n')
        ly = TOP + 10 + 20 * i
        out.append(f'<line x1="{LEFT + width + 12}" y1="{ly}" x2="{LEFT + width + 32}" y2="{ly}" stroke="{colour}" '
                   f'stroke-width="2"/>\n<text x="{LEFT + width + 38}" y="{ly + 4}">{escape(s.label)}</text>\n')
    return "".join(out) + "</svg>\n"
