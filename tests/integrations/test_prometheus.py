"""``seqloader.export_metrics``: a loader's counters in a Prometheus registry, read at scrape time.

Every value is read through prometheus_client's own ``CollectorRegistry.get_sample_value`` and
``generate_latest`` on a fresh registry. Counts are what the loop consumed (not the read-ahead);
exporting changes no batch and no state; a loader resumed from a state in a new loader object
counts from 0 (the state holds positions, never measures: Prometheus reads it as a restart).
The per-executor promises (worker busy time, a healed worker) are in ``tests/contract/test_metrics.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

prometheus_client = pytest.importorskip("prometheus_client", reason="prometheus_client is in the 'test' extra")
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest  # noqa: E402

from seqloader import DataLoader, export_metrics  # noqa: E402
from seqloader.loader.tuning.totals import BOUNDS  # noqa: E402
from seqloader.testing import assert_batches_equal  # noqa: E402

LABELS = {"loader": "train", "rank": "0"}
NAMES = ("seqloader_batches_total", "seqloader_samples_total", "seqloader_wait_seconds_total",
         "seqloader_input_bound_ratio", "seqloader_worker_restarts_total", "seqloader_worker_busy_seconds_total",
         "seqloader_batch_wait_seconds")


def value(registry, name, labels=LABELS):
    return registry.get_sample_value(name, labels)


def loader_of(num_workers, **kw):
    kw = {"batch_size": 4, "shuffle": True, "seed": 3, "num_workers": num_workers, **kw}
    if num_workers:
        kw.setdefault("multiprocessing_context", "fork")
    return DataLoader(list(range(22)), **kw)


def histogram(registry, labels=LABELS):
    """``[(le, cumulative count)]`` of ``seqloader_batch_wait_seconds``, its count and sum."""
    buckets = []
    for family in registry.collect():
        if family.name == "seqloader_batch_wait_seconds":
            for s in family.samples:
                if s.name.endswith("_bucket") and all(s.labels.get(k) == v for k, v in labels.items()):
                    buckets.append((float(s.labels["le"]), s.value))
    return (buckets, value(registry, "seqloader_batch_wait_seconds_count", labels),
            value(registry, "seqloader_batch_wait_seconds_sum", labels))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_after_k_batches_the_counts_are_what_was_consumed_not_prefetched(num_workers):
    registry, loader = CollectorRegistry(), loader_of(num_workers)
    export_metrics(loader, registry, labels=LABELS)
    assert value(registry, "seqloader_batches_total") == 0.0
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert value(registry, "seqloader_batches_total") == 3.0
    assert value(registry, "seqloader_samples_total") == 12.0
    wait = value(registry, "seqloader_wait_seconds_total")
    assert wait > 0 and wait == pytest.approx(loader.stats()["current"]["wait_s"])
    assert 0.0 <= value(registry, "seqloader_input_bound_ratio") <= 1.0
    assert value(registry, "seqloader_worker_restarts_total") == 0.0
    rest = list(it)   # 22 samples in batches of 4: 5 of 4 and one of 2
    assert len(rest) == 3
    assert (value(registry, "seqloader_batches_total"), value(registry, "seqloader_samples_total")) == (6.0, 22.0)
    busy = [value(registry, "seqloader_worker_busy_seconds_total", {**LABELS, "worker": str(w)}) for w in range(2)]
    if num_workers:
        assert all(b is not None and b > 0 for b in busy), busy
    else:   # no workers: no worker samples
        assert busy == [None, None]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_histogram_agrees_with_the_wait_total_and_the_batches(num_workers):
    registry, loader = CollectorRegistry(), loader_of(num_workers)
    export_metrics(loader, registry, labels=LABELS)
    list(loader)
    list(loader)
    buckets, count, total = histogram(registry)
    assert [le for le, _ in buckets] == [*BOUNDS, float("inf")]
    counts = [n for _, n in buckets]
    assert counts == sorted(counts) and counts[-1] == count == value(registry, "seqloader_batches_total") == 12.0
    assert total == value(registry, "seqloader_wait_seconds_total")
    s = loader.stats()
    assert total == pytest.approx(s["last"]["wait_s"] + s["current"]["wait_s"])
    # each batch's wait lies in its bucket (previous bound, bound]: the sum lies between the bounds' sums
    per_bucket = [n - m for n, m in zip(counts, [0.0, *counts[:-1]])]
    lows, highs = [0.0, *BOUNDS], [*BOUNDS, float("inf")]
    assert sum(n * lo for n, lo in zip(per_bucket, lows)) <= total
    assert total <= sum(n * hi for n, hi in zip(per_bucket, highs) if n)


def test_exporting_changes_no_batch_and_no_state():
    plain, exported = loader_of(2), loader_of(2)
    registry = CollectorRegistry()
    export_metrics(exported, registry, labels=LABELS)
    for epoch in range(2):
        want, got = list(plain), []
        for b in exported:
            got.append(b)
            generate_latest(registry)   # a scrape between batches
        assert_batches_equal(got, want, f"epoch {epoch}")
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert exported.state_dict() == plain.state_dict()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_loader_counts_its_own_consumption_from_0(num_workers):
    first = loader_of(num_workers)
    it = iter(first)
    done = [next(it) for _ in range(2)]
    sd = first.state_dict()
    del it
    want = list(loader_of(num_workers))[2:]
    resumed = loader_of(num_workers)
    resumed.load_state_dict(sd)
    registry = CollectorRegistry()
    export_metrics(resumed, registry, labels=LABELS)
    got = list(resumed)
    assert_batches_equal(got, want, "the rest of the epoch")
    assert len(done) + len(got) == 6
    assert value(registry, "seqloader_batches_total") == 4.0     # this loader's batches, not the epoch's
    assert value(registry, "seqloader_samples_total") == 14.0    # 22 - 2 * 4
    # the same object loading a state again: its counts go on (they only grow)
    resumed.load_state_dict(sd)
    list(resumed)
    assert (value(registry, "seqloader_batches_total"), value(registry, "seqloader_samples_total")) == (8.0, 28.0)
    assert resumed.stats()["resumes"] == 2


def test_every_sample_carries_the_labels_and_workers_their_index():
    registry, loader = CollectorRegistry(), loader_of(2)
    export_metrics(loader, registry, labels=LABELS)
    list(loader)
    families = [f for f in registry.collect() if f.name.startswith("seqloader_")]
    assert sorted(f.name.removesuffix("_total") if f.type == "counter" else f.name for f in families) == \
        sorted(n.removesuffix("_total") for n in NAMES)
    samples = [s for f in families for s in f.samples]
    assert len(samples) >= 7 + 16
    for s in samples:
        assert {k: s.labels[k] for k in LABELS} == LABELS, s
    workers = sorted(s.labels["worker"] for s in samples if s.name == "seqloader_worker_busy_seconds_total")
    assert workers == ["0", "1"]
    text = generate_latest(registry).decode()
    assert 'seqloader_batch_wait_seconds_bucket{le="0.0001",loader="train",rank="0"}' in text
    assert 'seqloader_worker_busy_seconds_total{loader="train",rank="0",worker="1"}' in text


def test_unregister_stops_the_export_and_the_default_registry_is_the_default():
    loader = loader_of(0)
    collector = export_metrics(loader, labels={"loader": "default-registry-test"})
    try:
        list(loader)
        assert REGISTRY.get_sample_value("seqloader_batches_total", {"loader": "default-registry-test"}) == 6.0
    finally:
        REGISTRY.unregister(collector)
    assert REGISTRY.get_sample_value("seqloader_batches_total", {"loader": "default-registry-test"}) is None
    registry = CollectorRegistry()
    collector = export_metrics(loader, registry)   # no labels: samples without labels
    assert value(registry, "seqloader_batches_total", {}) == 6.0
    registry.unregister(collector)
    assert "seqloader" not in generate_latest(registry).decode()
    export_metrics(loader, registry)   # a registry without it takes it again


def test_several_loaders_on_one_registry_through_the_collector():
    registry, train, val = CollectorRegistry(), loader_of(0), loader_of(0, batch_size=11)
    collector = export_metrics(train, registry, labels={"loader": "train"})
    with pytest.raises(ValueError, match=r"export_metrics: the registry has seqloader's metrics already .*"
                                         r"collector\.add\(loader"):
        export_metrics(val, registry, labels={"loader": "val"})
    collector.add(val, labels={"loader": "val"})
    list(train)
    list(val)
    assert value(registry, "seqloader_batches_total", {"loader": "train"}) == 6.0
    assert value(registry, "seqloader_batches_total", {"loader": "val"}) == 2.0
    with pytest.raises(ValueError, match="labels \\['rank'\\] differ from the label names"):
        collector.add(loader_of(0), labels={"rank": "1"})
    with pytest.raises(ValueError, match="exported here already"):
        collector.add(loader_of(0), labels={"loader": "val"})
    del val   # a loader the program dropped is no longer reported
    import gc
    gc.collect()
    assert value(registry, "seqloader_batches_total", {"loader": "val"}) is None
    assert value(registry, "seqloader_batches_total", {"loader": "train"}) == 6.0


@pytest.mark.parametrize("labels, error, match", [
    ({"le": "x"}, ValueError, "'le' is a label of seqloader's own metrics"),
    ({"worker": "x"}, ValueError, "'worker' is a label of seqloader's own metrics"),
    ({"a-b": "x"}, ValueError, "'a-b' is not a Prometheus label name"),
    ({"rank": 0.5}, TypeError, r"labels\['rank'\] must be a str or an int \(got float\)"),
    (["loader"], TypeError, "labels must be a dict"),
])
def test_bad_labels_raise_naming_them_and_register_nothing(labels, error, match):
    registry = CollectorRegistry()
    with pytest.raises(error, match=match):
        export_metrics(loader_of(0), registry, labels=labels)
    assert "seqloader" not in generate_latest(registry).decode()


def test_an_int_label_is_its_str_and_a_torch_loader_is_refused():
    registry, loader = CollectorRegistry(), loader_of(0)
    export_metrics(loader, registry, labels={"rank": 3})
    assert value(registry, "seqloader_batches_total", {"rank": "3"}) == 0.0
    with pytest.raises(TypeError, match="loader must be a seqloader.DataLoader .got DataLoader."):
        export_metrics(torch.utils.data.DataLoader(range(4)), CollectorRegistry())


def test_samples_without_automatic_batching_of_a_stream_and_of_a_batch_that_raised():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(7))

    class Fails(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 5:
                raise KeyError(i)
            return {"x": torch.tensor([i, i])}

    registry, one, stream, failing = CollectorRegistry(), loader_of(0, batch_size=None), \
        DataLoader(Stream(), batch_size=3), DataLoader(Fails(), batch_size=2)
    collector = export_metrics(one, registry, labels={"loader": "one"})
    collector.add(stream, labels={"loader": "stream"}).add(failing, labels={"loader": "failing"})
    list(one)
    assert [b.tolist() for b in stream] == [[0, 1, 2], [3, 4, 5], [6]]
    it = iter(failing)
    got = [next(it), next(it)]
    with pytest.raises(KeyError):
        next(it)
    got += list(it)
    assert len(got) == 3
    assert value(registry, "seqloader_samples_total", {"loader": "one"}) == 22.0
    assert value(registry, "seqloader_samples_total", {"loader": "stream"}) == 7.0
    # the batch that raised was consumed (a batch) but has no samples to count
    assert value(registry, "seqloader_batches_total", {"loader": "failing"}) == 4.0
    assert value(registry, "seqloader_samples_total", {"loader": "failing"}) == 6.0


def test_import_seqloader_does_not_import_prometheus_client():
    code = ("import sys, seqloader; seqloader.DataLoader; list(seqloader.DataLoader(range(4), batch_size=2)); "
            "assert 'prometheus_client' not in sys.modules and 'seqloader.integrations.prometheus' not in sys.modules; "
            "seqloader.export_metrics; assert 'prometheus_client' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_scrape_in_another_thread_while_the_loop_runs_never_sees_a_counter_go_back():
    import threading

    registry, loader = CollectorRegistry(), loader_of(2, persistent_workers=False)
    export_metrics(loader, registry, labels=LABELS)
    done, seen, errors = threading.Event(), [], []

    def scrape():
        try:
            while not done.is_set():
                seen.append([value(registry, name, labels) for name, labels in (
                    ("seqloader_batches_total", LABELS), ("seqloader_wait_seconds_total", LABELS),
                    ("seqloader_worker_busy_seconds_total", {**LABELS, "worker": "0"}),
                    ("seqloader_worker_busy_seconds_total", {**LABELS, "worker": "1"}))])
        except Exception as exc:   # reported below, in the test's thread
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for _ in range(4):
            list(loader)
    finally:
        done.set()
        scraper.join(60)
        sys.setswitchinterval(switch)
    assert not errors and not scraper.is_alive() and len(seen) > 1
    for column in zip(*seen):
        numbers = [v for v in column if v is not None]   # (no worker sample before the first epoch attached)
        assert numbers == sorted(numbers)
    assert value(registry, "seqloader_batches_total") == 24.0
    # no scrape counted more than the truth: the highest reported is what the loader holds
    truth = loader.totals()["workers"]
    for w in (0, 1):
        assert value(registry, "seqloader_worker_busy_seconds_total", {**LABELS, "worker": str(w)}) == \
            truth[w]["busy_s"]
