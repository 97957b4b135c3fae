"""dashboard.png without a server: the drop overview drawn from canned range-query answers."""

from __future__ import annotations

from pathlib import Path

from flashcoupon_loadtest import dashboard_png, queries


def test_every_panel_is_drawn_from_its_own_queries(tmp_path: Path) -> None:
    asked: list[str] = []

    def query_range(expr: str, start: float, end: float, step: float) -> list[dict[str, object]]:
        asked.append(expr)
        if "queued_total" in expr:
            return []  # a panel without data is drawn as such
        values = [[start + i, str(i * 1.5)] for i in range(int(end - start))]
        return [{"metric": {"event": "bf", "outcome": "ISSUED"}, "values": values}]

    out = tmp_path / "dashboard.png"
    variables = {"namespace": "local", "event": "bf", "datasource": "prometheus"}
    drawn = dashboard_png.render(
        queries.DASHBOARDS / "drop-overview.json", out, query_range, start=1000.0, end=1060.0,
        substitute=lambda e: queries.substitute(e, variables, "4s", "60s"),
    )  # fmt: skip
    panels = [q for q in queries.dashboard_queries() if q.key.startswith("flashcoupon-drop/")]
    assert len(asked) == len(panels)
    assert all("$" not in e for e in asked), "every variable substituted"
    assert all('event=~"bf"' in e for e in asked if "issuance_total" in e)
    assert drawn == len({q.key.rsplit("/", 1)[0] for q in panels}) - 1
    assert out.stat().st_size > 20_000


def test_values_print_in_the_panels_units() -> None:
    assert dashboard_png.fmt_value(0.0421, "s") == "42.1 ms"
    assert dashboard_png.fmt_value(0, "s") == "0 s"
    assert dashboard_png.fmt_value(0.005, "percentunit") == "0.50 %"
    assert dashboard_png.fmt_value(1234.5, "cps") == "1,234.5/s"
    assert dashboard_png.fmt_value(300, "none") == "300"
