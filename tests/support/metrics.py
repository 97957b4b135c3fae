"""Read Prometheus metrics the way a scraper sees them, never through private attributes.

`sample` reads this process's default registry (services run in-process); `scraped` reads the
text a service process serves on /metrics. Both sum every series matching the given labels
and read 0 when none exists yet (a counter that has never been incremented has no series).
"""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families


def sample(name: str, **labels: str) -> float:
    """One sample of the in-process default registry, e.g. sample("x_total", what="db")."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def scraped(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`, from /metrics text."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def scraped_exactly(text: str, name: str) -> float:
    """An unlabelled sample that must be there (a gauge the service always exports)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and not s.labels:
                return s.value
    raise AssertionError(f"{name} not in /metrics")
