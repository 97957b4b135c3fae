"""A Grafana dashboard drawn without Grafana: its panels' own queries, as Prometheus range
queries over a run, rendered with matplotlib into one PNG (loadtest/results/dashboard.png).

Someone without Grafana then sees what an SRE would: the same expressions as the JSON in
charts/flashcoupon/dashboards/, the same layout order, units and legends. Time series panels
become line charts; stat panels show their last value (Grafana's `lastNotNull`) over a faint
sparkline. Rate windows shrink to what Grafana would pick at this scrape interval
($__rate_interval = 4 × scrape interval), so a burst of a few seconds keeps its shape.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RangeQuery = Callable[[str, float, float, float], list[dict[str, Any]]]


def _legend(fmt: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), fmt).strip() or "value"


def fmt_value(value: float, unit: str) -> str:
    """The value as Grafana's unit would print it (the few units the dashboards use)."""
    if math.isnan(value):
        return "—"
    if unit == "s":
        if value == 0:
            return "0 s"
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "percentunit":
        return f"{value * 100:.2f} %"
    if unit in {"cps", "ops", "reqps"}:
        return f"{value:,.1f}/s"
    return f"{value:,.0f}" if unit == "none" or value == int(value) else f"{value:,.2f}"


def _ylabel(unit: str) -> str:
    return {"s": "seconds", "percentunit": "ratio", "cps": "per second", "reqps": "req/s"}.get(
        unit, ""
    )


def render(
    board_path: Path,
    out: Path,
    query_range: RangeQuery,
    *,
    start: float,
    end: float,
    substitute: Callable[[str], str],
    subtitle: str = "",
) -> int:
    """Draw every panel of the dashboard; returns how many panels had data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    board = json.loads(board_path.read_text())
    panels = sorted(
        (p for p in board["panels"] if p["type"] != "row"),
        key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]),
    )
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False)
    step = max(1.0, (end - start) / 300)
    with_data = 0
    for ax, panel in zip(axes.flat, panels, strict=False):
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        drawn = _panel(ax, panel, unit, query_range, start, end, step, substitute)
        with_data += drawn
        ax.set_title(panel["title"], fontsize=10, loc="left")
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", color="grey",
                    transform=ax.transAxes)  # fmt: skip
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{board['title']}   {subtitle}", fontsize=13, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return with_data


def _panel(
    ax: Any,
    panel: Mapping[str, Any],
    unit: str,
    query_range: RangeQuery,
    start: float,
    end: float,
    step: float,
    substitute: Callable[[str], str],
) -> bool:
    lines: list[tuple[str, list[float], list[float]]] = []
    for target in panel["targets"]:
        for series in query_range(substitute(target["expr"]), start, end, step):
            xs = [float(t) - start for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            lines.append((_legend(target.get("legendFormat", ""), series["metric"]), xs, ys))
    if not lines:
        ax.set_xticks([])
        ax.set_yticks([])
        return False
    if panel["type"] == "stat":
        text = []
        for label, xs, ys in lines:
            real = [y for y in ys if not math.isnan(y)]
            last = real[-1] if real else math.nan
            ax.plot(xs, ys, alpha=0.25)
            text.append(f"{fmt_value(last, unit)}" + (f"  {label}" if len(lines) > 1 else ""))
        ax.text(0.5, 0.5, "\n".join(text[:4]), ha="center", va="center", fontsize=18,
                transform=ax.transAxes)  # fmt: skip
        ax.set_yticks([])
    else:
        for label, xs, ys in lines[:8]:
            ax.plot(xs, ys, label=label[:40], linewidth=1.2)
        for step_ in panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", []):
            if step_.get("value") is not None and step_.get("color") == "red":
                ax.axhline(step_["value"], color="red", linestyle="--", linewidth=0.8)
        ax.set_ylabel(_ylabel(unit), fontsize=8)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(True, alpha=0.3)
    ax.set_xlim(0, end - start)
    ax.set_xlabel("seconds", fontsize=8)
    return True
