"""Trajectories as text: sparklines for table cells and Mermaid ``xychart-beta`` line charts.

Series arrive as per-step values with gaps (``None``); here they are float arrays with NaN for a gap.
Every label that reaches a chart is reduced to characters that cannot end Mermaid's quoted title.

Mermaid's default palette draws the first line in ``#ECECFF``, nearly invisible on white, and an
xychart has no legend; so every chart sets a fixed palette with an init directive and the caption
names the colours. The x-axis is numeric (Mermaid picks non-overlapping ticks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gate.render import escape as esc
from gate.render.escape import Safe

SPARK = "▁▂▃▄▅▆▇█"
SERIES = ("old", "new", "band_low", "band_high")  # the lines of a GRPO metric, in drawing order

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Palette:
    """Line colours by series (readable on GitHub's light and dark backgrounds) and their names."""

    old: str = "#1f77b4"
    new: str = "#d62728"
    band: str = "#8c8c8c"
    old_name: str = "blue"
    new_name: str = "red"
    band_name: str = "grey"

    def color(self, key: str) -> str:
        return self.band if key.startswith("band") else getattr(self, key)


PALETTE = Palette()


def as_series(values: Iterable[object]) -> FloatArray:
    """Per-step values as floats; anything that is not a finite number is a gap (NaN)."""
    out = [
        float(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        else math.nan
        for v in values
    ]
    return np.array(out, dtype=np.float64)


def value_range(series: Iterable[FloatArray]) -> tuple[float, float] | None:
    """The lowest and highest value over all the series; None when they hold no value."""
    values = np.concatenate([np.empty(0), *series])
    values = values[~np.isnan(values)]
    return (float(values.min()), float(values.max())) if len(values) else None


def last_value(values: FloatArray) -> float | None:
    present = values[~np.isnan(values)]
    return float(present[-1]) if len(present) else None


def downsample(values: FloatArray, k: int) -> FloatArray:
    """Bucket means to at most ``k`` points (NaN where a bucket has no value)."""
    n = len(values)
    if n <= k:
        return values
    starts = np.arange(k) * n // k  # strictly increasing: every bucket holds at least one step
    present = ~np.isnan(values)
    sums = np.add.reduceat(np.where(present, values, 0.0), starts)
    counts = np.add.reduceat(present.astype(np.int64), starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), math.nan)


def sparkline(
    values: Iterable[float | None],
    lo: float | None = None,
    hi: float | None = None,
    width: int = 40,
) -> str:
    """One block character per point (a space for a gap), scaled between ``lo`` and ``hi``."""
    vals = downsample(as_series(values), width)
    present = ~np.isnan(vals)
    if not present.any():
        return ""
    lo = float(vals[present].min()) if lo is None else lo
    hi = float(vals[present].max()) if hi is None else hi
    span = hi - lo
    top = len(SPARK) - 1
    levels = np.zeros(len(vals), dtype=np.int64)
    if span > 0:
        levels = np.clip(np.rint((np.nan_to_num(vals) - lo) / span * top), 0, top).astype(np.int64)
    return "".join(SPARK[lv] if ok else " " for lv, ok in zip(levels, present, strict=True))


def fixed(values: Iterable[float], digits: int = 4) -> Callable[[float], str]:
    """Fixed-point formatting (Mermaid reads no exponents) with ``digits`` significant digits of the range."""
    scale = max((abs(v) for v in values), default=1.0) or 1.0
    decimals = min(12, max(0, digits - 1 - math.floor(math.log10(scale))))
    return lambda v: f"{v:.{decimals}f}"


def mermaid_label(name: str) -> str:
    return (
        "".join(ch if ch.isalnum() or ch in " _.-" else "_" for ch in esc.clean(name))[:60]
        or "metric"
    )


def forward_fill(values: FloatArray) -> FloatArray | None:
    """Gaps carry the last value forward (the start takes the first value); None when all are gaps."""
    present = ~np.isnan(values)
    if not present.any():
        return None
    last = np.where(present, np.arange(len(values)), 0)
    np.maximum.accumulate(last, out=last)
    first = int(np.argmax(present))
    return np.where(np.arange(len(values)) < first, values[first], values[last])


@dataclass(frozen=True)
class Chart:
    """What the grpo template draws: one Mermaid line chart of a metric's series."""

    name: str
    title: Safe
    xmin: Safe
    xmax: Safe
    ymin: Safe
    ymax: Safe
    lines: tuple[Safe, ...]
    labels: str
    colors: Safe  # the palette in line order, for the init directive
    exit: int | None  # the step where the new engine left the band


def line_chart(
    name: str,
    series: Mapping[str, FloatArray],
    lo: float,
    hi: float,
    points: int,
    exit_step: int | None = None,
) -> Chart | None:
    """The series (``SERIES`` order) sampled at up to ``points`` steps; None for fewer than two steps.

    Mermaid spreads a line's points evenly over a numeric axis, so the steps sampled are evenly
    spaced too (bucket means would shift a spike; the nearest step keeps it where it was)."""
    n = max(len(s) for s in series.values())
    if n < 2:
        return None
    k = min(points, n)
    idx = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    fmt = fixed([lo - pad, hi + pad, hi - lo or pad])
    lines, labels, colors = [], [], []
    for key in SERIES:
        padded = np.concatenate([series[key], np.full(n - len(series[key]), math.nan)])
        filled = forward_fill(padded)
        if filled is None:
            continue
        labels.append(key.replace("_", " "))
        colors.append(PALETTE.color(key))
        lines.append(Safe(", ".join(fmt(float(filled[i])) for i in idx)))
    return Chart(
        name=esc.clean(name),
        title=Safe(mermaid_label(name)),
        xmin=Safe(str(idx[0])),
        xmax=Safe(str(idx[-1])),
        ymin=Safe(fmt(lo - pad)),
        ymax=Safe(fmt(hi + pad)),
        lines=tuple(lines),
        labels=", ".join(labels),
        colors=Safe(", ".join(colors)),
        exit=exit_step,
    )
