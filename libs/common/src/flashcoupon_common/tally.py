"""Counters and histograms for the hot path, counted with plain arithmetic and exported by
prometheus_client at scrape time.

prometheus_client's children take a lock on every `inc()` and `observe()` (a histogram takes
two, after a Python loop over its buckets): ~0.9 µs per increment and ~1.4 µs per observation
on the development machine, ~3 µs per issue request for its three records, a twentieth of the
issuer's CPU per press and of the gateway's per sold-out answer. The services record from one
thread, their event loop, so the lock buys nothing there. A tally is a prometheus_client
*collector* (the library's own extension point): each child is two or three numbers a record
adds to, and `collect()` turns them into the same families, names, labels, buckets and
`_created` samples a Counter or Histogram would expose.

Record from one thread only (the event loop): two threads adding to the same child can lose
an increment. A scrape from another thread (prometheus_client's own server) is safe: it reads
numbers while they are written, and a histogram's count is derived from the buckets it read,
so `_count` always equals the `+Inf` bucket.
"""

from __future__ import annotations

import bisect
import os
import time
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# prometheus_client's own switch for the `_created` samples, read as it reads it.
_CREATED = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in (
    "true",
    "1",
    "t",
)


class Count:
    """One counter series: `inc()` adds to a float."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class Spread:
    """One histogram series: `observe()` adds to the first bucket whose bound is >= the value
    (Prometheus' `le`), and to the sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


S = TypeVar("S", Count, Spread)


class _Tally(Collector, Generic[S]):
    """The series of one metric by label values; registered with `registry` at creation.
    A subclass says how a series starts (`_new`) and how the family reads (`_family`,
    `_add`)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], S] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> S:
        """The series of these label values, made (at 0) on first use."""
        child = self._series.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            child = self._series[values] = self._new()
        return child

    def remove(self, *values: str) -> None:
        self._series.pop(tuple(values), None)

    def describe(self) -> Iterator[Metric]:
        # What the registry checks for duplicate names when this tally is registered.
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in list(self._series.items()):
            self._add(family, values, child)
        yield family

    @abstractmethod
    def _new(self) -> S:
        """A new series, at 0."""

    @abstractmethod
    def _family(self) -> Metric:
        """The family, without samples."""

    @abstractmethod
    def _add(self, family: Metric, values: tuple[str, ...], child: S) -> None:
        """Add the samples of one series to `family`."""


class CounterTally(_Tally[Count]):
    """A counter family (`<name>_total`), as prometheus_client.Counter exposes it."""

    def _new(self) -> Count:
        return Count()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, values: tuple[str, ...], child: Count) -> None:
        assert isinstance(family, CounterMetricFamily)
        family.add_metric(values, child.value, created=child.created if _CREATED else None)


class HistogramTally(_Tally[Spread]):
    """A histogram family (`_bucket`, `_count`, `_sum`), as prometheus_client.Histogram
    exposes it; `buckets` are the finite upper bounds, +Inf is added."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        bounds = [float(b) for b in buckets if b != float("inf")]
        if not bounds or bounds != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be increasing, got {list(buckets)}")
        self.bounds = tuple(bounds)
        # as prometheus_client spells a bound (1 -> "1.0")
        self._les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> Spread:
        return Spread(self.bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, values: tuple[str, ...], child: Spread) -> None:
        assert isinstance(family, HistogramMetricFamily)
        total, cumulative = 0, []
        for le, n in zip(self._les, list(child.counts), strict=True):
            total += n
            cumulative.append((le, float(total)))
        family.add_metric(values, cumulative, child.sum)
        if _CREATED:
            labels = dict(zip(self.labelnames, values, strict=True))
            family.samples.append(Sample(self.name + "_created", labels, child.created))
