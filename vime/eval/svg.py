"""Small inline-SVG charts (a line with error bars, a bar chart) for self-contained reports."""

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
