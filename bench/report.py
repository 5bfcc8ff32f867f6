"""Small helpers the benchmarks share: percentiles, unit formatting, markdown tables and target lines."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The sample at `fraction` of the sorted list (nearest rank), so p99 of 1,000 samples is the 990th."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(fraction * len(ordered))))
    return ordered[rank - 1]


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def micros(seconds: float) -> str:
    value = seconds * 1e6
    return f"{value:.2f} µs" if value < 100 else f"{value:,.0f} µs"


def millis(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def target(passed: bool, text: str) -> str:
    return f"- {'PASS' if passed else 'FAIL'}: {text}"
