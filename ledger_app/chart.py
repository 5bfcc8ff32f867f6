"""The activity chart, drawn on the server as SVG: entries per hour, stacked by outcome, no script needed."""

from __future__ import annotations

from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

OUTCOME_COLOURS = (("ok", "#1a7f4b"), ("error", "#c27c0e"), ("denied", "#b42318"))
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 170, 34, 22, 8


def activity_svg(buckets: list[dict[str, Any]], *, title: str) -> SafeString:
    """Stacked bars, one per hour; each bar's tooltip says its counts; the axis marks every sixth hour."""
    peak = max((sum(b[o] for o, _ in OUTCOME_COLOURS) for b in buckets), default=0)
    scale = max(peak, 1)
    plot_w, plot_h = WIDTH - LEFT - 4, HEIGHT - BOTTOM - TOP
    slot = plot_w / max(len(buckets), 1)
    total = sum(sum(b[o] for o, _ in OUTCOME_COLOURS) for b in buckets)
    parts = [
        f'<svg class="lg-chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}: '
        f'{total} entries" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 4}" y2="{TOP + plot_h}" class="lg-axis"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 9}" text-anchor="end" class="lg-tick">{peak}</text>',
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end" class="lg-tick">0</text>',
    ]
    for i, bucket in enumerate(buckets):
        x = LEFT + i * slot + 1
        y = TOP + plot_h
        counts = ", ".join(f"{bucket[o]} {o}" for o, _ in OUTCOME_COLOURS if bucket[o]) or "nothing"
        start = bucket["start"]
        parts.append(f"<g><title>{start:%b %d, %H:00}–{(start.hour + 1) % 24:02d}:00 UTC: {counts}</title>")
        parts.append(f'<rect x="{x:.1f}" y="{TOP}" width="{slot - 2:.1f}" height="{plot_h}" class="lg-slot"/>')
        for outcome, colour in OUTCOME_COLOURS:
            height = bucket[outcome] / scale * plot_h
            if bucket[outcome]:
                height = max(height, 1.5)
                y -= height
                parts.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot - 2:.1f}" height="{height:.1f}" fill="{colour}"/>'
                )
        parts.append("</g>")
        if i % 6 == 0:
            parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 6}" class="lg-tick">{start:%H}:00</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 -- every interpolated text is escaped or a number


def legend() -> list[tuple[str, str]]:
    return list(OUTCOME_COLOURS)
