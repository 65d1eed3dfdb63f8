"""L4: a loader's numbers as Prometheus metrics, read at scrape time: :func:`export_metrics`.

The collector reads :meth:`DataLoader.totals() <seqloader.DataLoader.totals>` at each scrape (from
the scraping thread, while the loop runs) and turns it into Prometheus samples, each carrying the
labels given (``{"loader": "train", "rank": "0"}``). Nothing is pushed and nothing runs between
scrapes: a loader pays the one histogram increment per batch it always pays
(:mod:`seqloader.loader.tuning.totals`), and 0.15-0.35 µs more for counting the samples of a
batch once exported. Nothing of this changes a batch or the state.

``prometheus_client`` is imported here only (``pip install seqloader[metrics]``); ``import seqloader``
does not import this module.
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any, Iterator, Optional

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.registry import REGISTRY
    from prometheus_client.utils import floatToGoString
except ImportError as exc:  # pragma: no cover - the extra is installed in the test environment
    raise ImportError("seqloader.export_metrics needs prometheus_client: pip install seqloader[metrics] "
                      "(or pip install prometheus_client)") from exc

__all__ = ["LoaderCollector", "export_metrics"]

#: (name, type, help) of each metric, in the order a scrape shows them.
METRICS = (
    ("seqloader_batches_total", "counter", "Batches the training loop consumed (returned by next(), or raised)."),
    ("seqloader_samples_total", "counter", "Samples in the batches the training loop consumed."),
    ("seqloader_wait_seconds_total", "counter", "Seconds the training loop waited inside next() for data."),
    ("seqloader_input_bound_ratio", "gauge", "Fraction of this epoch's wall time the loop waited for data."),
    ("seqloader_worker_restarts_total", "counter", "Dead workers replaced (max_worker_restarts)."),
    ("seqloader_worker_busy_seconds_total", "counter",
     "Seconds each worker spent computing batches (read-ahead included)."),
    ("seqloader_batch_wait_seconds", "histogram", "Seconds the training loop waited for each batch."),
)

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_OURS = ("worker", "le")   # label names the metrics use themselves


def _check_labels(labels: Optional[dict]) -> dict:
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise TypeError(f"export_metrics: labels must be a dict of label name -> value (got {type(labels).__name__})")
    out = {}
    for name, value in labels.items():
        if not isinstance(name, str) or not _LABEL.match(name) or name.startswith("__"):
            raise ValueError(f"export_metrics: labels: {name!r} is not a Prometheus label name "
                             "([a-zA-Z_][a-zA-Z0-9_]*, not starting with '__')")
        if name in _OURS:
            raise ValueError(f"export_metrics: labels: {name!r} is a label of seqloader's own metrics; "
                             "use another name")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise TypeError(f"export_metrics: labels[{name!r}] must be a str or an int (got {type(value).__name__})")
        out[name] = str(value)
    return out


def _check_loader(loader: Any) -> None:
    if not callable(getattr(loader, "totals", None)):
        raise TypeError(f"export_metrics: loader must be a seqloader.DataLoader (got {type(loader).__name__}); "
                        "torch's DataLoader keeps no counters")


class LoaderCollector:
    """The Prometheus collector of one or more loaders (:func:`export_metrics` builds it).

    It holds each loader by a weak reference (a loader dropped by the program stops being reported)
    and keeps every counter it reports from going back within a loader (a scrape racing an epoch's
    start may read a worker's numbers a moment late; it then reports the previous value).
    """

    def __init__(self) -> None:
        self._loaders: list[tuple[Any, dict]] = []   # (weak reference, labels)
        self._names: Optional[tuple] = None          # the label names every loader has
        self._lock = threading.Lock()                # scrapes may run in several threads
        self._high: dict[tuple, float] = {}          # (loader's labels, metric, worker): the highest reported

    def add(self, loader: Any, labels: Optional[dict] = None) -> "LoaderCollector":
        """Report ``loader`` too, with ``labels`` (the same label names as the others, other values).

        Raises:
            TypeError: ``loader`` has no ``totals()`` (not a ``seqloader.DataLoader``), or a bad label.
            ValueError: other label names than the loaders already reported, or the same values.
        """
        _check_loader(loader)
        labels = _check_labels(labels)
        names = tuple(labels)
        with self._lock:
            if self._names is not None and names != self._names:
                raise ValueError(f"export_metrics: labels {list(names)} differ from the label names of the loaders "
                                 f"already exported here {list(self._names)}; give every loader the same names")
            if any(seen == labels for _, seen in self._loaders):
                raise ValueError(f"export_metrics: a loader with labels {labels} is exported here already; "
                                 "give each loader its own label values (e.g. {'loader': 'val'})")
            loader.totals(count_samples=True)
            self._names = names
            self._loaders.append((weakref.ref(loader), labels))
        return self

    def describe(self) -> list:
        """The metric families, without samples (the registry checks names against other collectors)."""
        return list(self._families(()).values())

    def collect(self) -> Iterator[Any]:
        """The samples of every loader still alive, read now."""
        with self._lock:
            names = self._names or ()
            families = self._families(names)
            for ref, labels in self._loaders:
                loader = ref()
                if loader is not None:
                    self._add(families, loader.totals(), labels)
        return iter(families.values())

    def _families(self, names: tuple) -> dict:
        made = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}
        return {name: made[kind](name, doc, labels=[*names, "worker"] if "worker" in name else list(names))
                for name, kind, doc in METRICS}

    def _rising(self, key: tuple, value: float) -> float:
        high = max(self._high.get(key, value), value)
        self._high[key] = high
        return high

    def _add(self, families: dict, t: dict, labels: dict) -> None:
        values, key = list(labels.values()), tuple(labels.items())
        counters = {"seqloader_batches_total": t["batches"], "seqloader_wait_seconds_total": t["wait_s"],
                    "seqloader_worker_restarts_total": t["worker_restarts"]}
        if t["samples"] is not None:
            counters["seqloader_samples_total"] = t["samples"]
        for name, value in counters.items():
            families[name].add_metric(values, self._rising((key, name), float(value)))
        families["seqloader_input_bound_ratio"].add_metric(values, t["input_bound"])
        for i, w in enumerate(t["workers"]):
            name = "seqloader_worker_busy_seconds_total"
            families[name].add_metric([*values, str(i)], self._rising((key, name, i), w["busy_s"]))
        buckets = [(floatToGoString(bound), float(n)) for bound, n in t["wait_buckets"]]
        families["seqloader_batch_wait_seconds"].add_metric(values, buckets, sum_value=t["wait_s"])


def export_metrics(loader: Any, registry: Any = None, labels: Optional[dict] = None) -> LoaderCollector:
    """Export ``loader``'s numbers to Prometheus: register a collector that reads them at each scrape.

    Every sample carries ``labels``. The metrics (counts of what the training loop consumed, not
    of what the workers read ahead; a loader built in a new process, resumed from a state, starts
    at 0, which Prometheus reads as a restart):

    * ``seqloader_batches_total``, ``seqloader_samples_total`` (samples counted from the export on),
      ``seqloader_wait_seconds_total`` (the loop waiting inside ``next()``);
    * ``seqloader_input_bound_ratio``: the current epoch's waiting share of its wall time;
    * ``seqloader_worker_restarts_total``; ``seqloader_worker_busy_seconds_total{worker="i"}``
      (seconds each worker computed batches; none at ``num_workers=0``);
    * the histogram ``seqloader_batch_wait_seconds`` (buckets 100 µs to 10 s; its ``_count`` is
      ``seqloader_batches_total``, its ``_sum`` ``seqloader_wait_seconds_total``), for
      ``histogram_quantile``.

    See ``docs/input_bound.md``, "On a dashboard".

    Args:
        loader: a :class:`seqloader.DataLoader`.
        registry: a ``prometheus_client.CollectorRegistry``; ``None``: ``prometheus_client.REGISTRY``.
        labels: ``{label name: str or int}`` put on every sample (``None``: none); ``worker`` and
            ``le`` are seqloader's own.

    Returns:
        The :class:`LoaderCollector`: ``registry.unregister(it)`` stops the export;
        ``it.add(other_loader, labels=...)`` exports another loader on the same registry.

    Raises:
        TypeError: ``loader`` is not a seqloader ``DataLoader``; a label value not a str or int.
        ValueError: a bad label name, or the registry has seqloader's metrics already (export the
            next loader with ``add`` on the collector returned first).

    Example:
        >>> from prometheus_client import CollectorRegistry
        >>> from seqloader import DataLoader, export_metrics
        >>> registry = CollectorRegistry()
        >>> loader = DataLoader(range(10), batch_size=4, seed=0)
        >>> metrics = export_metrics(loader, registry, labels={"loader": "train", "rank": 0})
        >>> _ = list(loader)
        >>> [registry.get_sample_value(f"seqloader_{m}", {"loader": "train", "rank": "0"})
        ...  for m in ("batches_total", "samples_total", "batch_wait_seconds_count")]
        [3.0, 10.0, 3.0]
        >>> export_metrics(loader, registry)
        Traceback (most recent call last):
        ValueError: export_metrics: the registry has seqloader's metrics already (another export_metrics on it); export another loader on the collector it returned: collector.add(loader, labels={...}), or unregister that one first
        >>> registry.unregister(metrics)
        >>> registry.get_sample_value("seqloader_batches_total", {"loader": "train", "rank": "0"}) is None
        True
    """
    _check_loader(loader)
    _check_labels(labels)
    collector = LoaderCollector()
    registry = REGISTRY if registry is None else registry
    try:
        registry.register(collector)
    except ValueError as exc:  # prometheus_client's DuplicateTimeseries
        raise ValueError("export_metrics: the registry has seqloader's metrics already (another export_metrics "
                         "on it); export another loader on the collector it returned: collector.add(loader, "
                         "labels={...}), or unregister that one first") from exc
    return collector.add(loader, labels)   # (checked: it cannot fail now)
