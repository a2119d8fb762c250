"""Small inline-SVG charts (a line with error bars, lines over an auto-scaled axis, a bar chart)
for self-contained reports."""

from __future__ import annotations

import html

WIDTH, HEIGHT, PAD = 420, 280, 48


def _frame(title: str, body: str, x_label: str, y_label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(title)}">'
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>'
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="15">{html.escape(title)}</text>'
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD / 2}" y2="{HEIGHT - PAD}" stroke="#444"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12">'
        f"{html.escape(x_label)}</text>"
        f'<text x="14" y="{HEIGHT / 2}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 14 {HEIGHT / 2})">{html.escape(y_label)}</text>'
        f"{body}</svg>"
    )


def line_chart(
    points: list[tuple[float, float]],
    errors: list[list[float] | None],
    *,
    title: str,
    x_label: str,
    y_label: str,
) -> str:
    """Points joined by a line on a 0..1 y axis, with vertical [low, high] error bars."""
    if not points:
        return _frame(title, "", x_label, y_label)
    xs = [x for x, _ in points]
    span = (max(xs) - min(xs)) or 1.0
    plot_w, plot_h = WIDTH - 1.5 * PAD, HEIGHT - 2 * PAD

    def px(x: float) -> float:
        return PAD + 10 + (x - min(xs)) / span * (plot_w - 20)

    def py(y: float) -> float:
        return HEIGHT - PAD - y * plot_h

    parts = []
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(
            f'<text x="{PAD - 6}" y="{py(tick) + 4:.1f}" text-anchor="end" font-size="10">'
            f"{tick:g}</text>"
        )
    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    parts.append(f'<polyline points="{line}" fill="none" stroke="#2a6fdb" stroke-width="2"/>')
    for (x, y), err in zip(points, errors, strict=True):
        if err:
            parts.append(
                f'<line x1="{px(x):.1f}" y1="{py(err[0]):.1f}" x2="{px(x):.1f}" '
                f'y2="{py(err[1]):.1f}" stroke="#888"/>'
            )
        parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="#2a6fdb"/>')
        parts.append(
            f'<text x="{px(x):.1f}" y="{HEIGHT - PAD + 14}" text-anchor="middle" '
            f'font-size="10">{x:g}</text>'
        )
    return _frame(title, "".join(parts), x_label, y_label)


COLOURS = ("#2a6fdb", "#e07b39", "#3a9d5d", "#b23a48", "#7b5ea7", "#888888")


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [low, high]."""
    import math

    span = high - low
    raw = span / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    return [first + i * step for i in range(math.ceil((high - first) / step) + 1)]


def series_chart(
    series: dict[str, list[tuple[float, float]]], *, title: str, x_label: str, y_label: str
) -> str:
    """One line per named series over a y axis scaled to the data, with a legend when there
    are several; each point has a hover title with its exact value."""
    points = [p for values in series.values() for p in values]
    if not points:
        return _frame(title, "", x_label, y_label)
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    low, high = min(ys), max(ys)
    if high - low < 1e-12:
        low, high = low - (abs(low) or 1.0) * 0.5, high + (abs(high) or 1.0) * 0.5
    ticks = _nice_ticks(low, high)
    low, high = min(low, ticks[0]), max(high, ticks[-1])
    x0, x1 = min(xs), max(xs)
    x_span = (x1 - x0) or 1.0
    plot_w, plot_h = WIDTH - 1.5 * PAD, HEIGHT - 2 * PAD

    def px(x: float) -> float:
        return PAD + 10 + (x - x0) / x_span * (plot_w - 20)

    def py(y: float) -> float:
        return HEIGHT - PAD - (y - low) / (high - low) * plot_h

    parts = [
        f'<text x="{PAD - 6}" y="{py(t) + 4:.1f}" text-anchor="end" font-size="10">{t:.3g}</text>'
        for t in ticks
    ]
    for x in sorted({x0, x1}):
        parts.append(
            f'<text x="{px(x):.1f}" y="{HEIGHT - PAD + 14}" text-anchor="middle" '
            f'font-size="10">{x:g}</text>'
        )
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in values)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in values:
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}">'
                f"<title>{html.escape(name)} at {x:g}: {y:.6g}</title></circle>"
            )
        if len(series) > 1:
            parts.append(
                f'<text x="{WIDTH - PAD / 2}" y="{40 + 13 * i}" text-anchor="end" font-size="11" '
                f'fill="{colour}">{html.escape(name)}</text>'
            )
    return _frame(title, "".join(parts), x_label, y_label)


def bar_chart(bins: list[tuple[str, int]], *, title: str) -> str:
    """One bar per (label, count), heights scaled to the largest count."""
    if not bins:
        return _frame(title, "", "reward", "samples")
    top = max(c for _, c in bins) or 1
    plot_w, plot_h = WIDTH - 1.5 * PAD, HEIGHT - 2 * PAD
    step = plot_w / len(bins)
    parts = []
    for i, (label, count) in enumerate(bins):
        h = count / top * plot_h
        x = PAD + i * step + step * 0.1
        parts.append(
            f'<rect x="{x:.1f}" y="{HEIGHT - PAD - h:.1f}" width="{step * 0.8:.1f}" '
            f'height="{h:.1f}" fill="#e07b39"><title>{html.escape(label)}: {count}</title></rect>'
        )
        parts.append(
            f'<text x="{x + step * 0.4:.1f}" y="{HEIGHT - PAD + 14}" text-anchor="middle" '
            f'font-size="10">{html.escape(label)}</text>'
        )
        parts.append(
            f'<text x="{x + step * 0.4:.1f}" y="{HEIGHT - PAD - h - 4:.1f}" '
            f'text-anchor="middle" font-size="10">{count}</text>'
        )
    return _frame(title, "".join(parts), "reward", "samples")
