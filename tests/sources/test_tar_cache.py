"""The tar index cache (``seqloader.sources._tar_cache``): nothing in a cache file can make a source
return other bytes; a damaged one is ignored with a warning naming it; an unwritable cache says so
once; long builds report progress."""

from __future__ import annotations

import json
import logging
import os
import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from seqloader.sources import _progress, tar_shards
from seqloader.sources._tar_cache import FORMAT, VERSION

from sources_helpers import read_tar_directly, write_shards


def beside(path):
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.seqloader-index.json")


@pytest.fixture
def shard(tmp_path):
    """One shard of 5 samples, indexed once (its cache file written beside it)."""
    path = write_shards(tmp_path / "s", [5])[0]
    tar_shards(path)
    return path


def cached(path):
    with open(beside(path)) as f:
        return json.load(f)


def rewrite(path, d):
    with open(beside(path), "w") as f:
        f.write(d if isinstance(d, str) else json.dumps(d))


def _compact(d):
    return json.dumps(d, separators=(",", ":"))


def _deep(n):
    return "[" * n + "]" * n


def _tamper(key, value):
    return lambda d: {**d, key: value(d) if callable(value) else value}


def _cell(key, e, j, value):
    def f(d):
        rows = [list(r) for r in d[key]]
        rows[e][j] = value(rows[e][j]) if callable(value) else value
        return {**d, key: rows}
    return f


#: (what the cache file holds, the reason the warning gives)
DAMAGED = [
    ("a JSON list", lambda d: [d], r"a JSON list, not an object"),
    ("deep nesting", lambda d: _deep(100_000), r"not JSON \(RecursionError"),
    ("deep nesting in a field", lambda d: _compact(d)[:-1] + ',"x":' + _deep(100_000) + "}", r"not JSON \(RecursionError"),
    ("an int of 5000 digits", lambda d: _compact(d).replace('"sizes":[[', '"sizes":[[' + "9" * 5000 + ",", 1),
     r"not JSON \(ValueError"),
    ("an int >= 2**63", _cell("offsets", 0, 0, 2**63), r"'offsets' holds 9223372036854775808|not a table"),
    ("a negative offset", _cell("offsets", 0, 1, -512), r"'offsets' holds -512, outside"),
    ("a fractional offset", _cell("offsets", 0, 1, 1536.5), r"'offsets' is not a table of 2 x 5 ints"),
    ("an offset off the block grid", _cell("offsets", 0, 1, lambda o: o + 1), r"not a data offset inside the archive"),
    ("a size of 2**40", _cell("sizes", 0, 1, 2**40), r"'sizes' holds 1099511627776, outside"),
    ("a size past the end marker", _cell("sizes", 1, 4, lambda s: s + 10_000), r"not a data offset inside the archive"),
    ("offsets out of order", lambda d: {**d, "offsets": [r[::-1] for r in d["offsets"]]}, r"out of file order|overlap"),
    ("overlapping members", _cell("offsets", 1, 0, lambda o: o - 512), r"overlap"),
    ("an offset outside the file", _cell("offsets", 1, 4, 10**9), r"'offsets' holds 1000000000, outside"),
    ("a string for an offset", _cell("offsets", 1, 4, "2048"), r"not a table of 2 x 5 ints"),
    ("a missing member and a present size", _cell("offsets", 1, 2, -1), r"disagree on a missing member"),
    ("a key twice", lambda d: {**d, "keys": [d["keys"][0]] * 5}, r"'keys' are not unique strings"),
    ("keys that are not strings", lambda d: {**d, "keys": list(range(5))}, r"'keys' are not unique strings"),
    ("fewer keys", lambda d: {**d, "keys": d["keys"][:4]}, r"not a table of 2 x 4 ints"),
    ("exts that are not a list", _tamper("exts", {"txt": 0}), r"'exts' is not a list"),
    ("another digest", _tamper("digest", "0" * 16), r"its digest does not match its member table"),
    ("no digest", lambda d: {k: v for k, v in d.items() if k != "digest"}, r"its digest does not match"),
    ("moved probes", lambda d: {**d, "probes": [[p[0] + 512, p[1]] for p in d["probes"]]}, r"'probes' are not"),
    ("a probe of another header", lambda d: {**d, "probes": [[p[0], "0" * 16] for p in d["probes"]]},
     r"its digest does not match"),
    ("another format", _tamper("format", "webdataset.index"), r"format 'webdataset\.index', not"),
    ("a version that is not an int", _tamper("version", "2"), r"no int version"),
    ("not JSON", lambda d: "\x00\xff garbage", r"not JSON"),
]


@pytest.mark.parametrize("mutate, reason", [d[1:] for d in DAMAGED], ids=[d[0] for d in DAMAGED])
def test_a_damaged_cache_file_is_ignored_with_a_warning_naming_it_and_rebuilt(shard, mutate, reason):
    good = cached(shard)
    rewrite(shard, mutate(good))
    with pytest.warns(UserWarning, match=rf"tar_shards: ignoring the cached index .*\.shard-000000\.tar\.seqloader-"
                                         rf"index\.json of .*shard-000000\.tar \(.*?(?:{reason})"):
        src = tar_shards(shard)
    assert src.index_stats == {"cached": 0, "scanned": 1}
    assert list(src) == read_tar_directly(shard)
    assert cached(shard) == good                       # replaced by the index just built
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tar_shards(shard).index_stats == {"cached": 1, "scanned": 0}


def test_a_stale_cache_file_is_replaced_without_a_warning(shard):
    for stale in ({"version": VERSION - 1}, {"path": "/elsewhere.tar"}, {"size": 1}, {"file_version": "mtime_ns:1"}):
        rewrite(shard, {**cached(shard), **stale})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            src = tar_shards(shard)
        assert src.index_stats == {"cached": 0, "scanned": 1} and cached(shard)["format"] == FORMAT


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                           | st.text(max_size=5), lambda c: st.lists(c, max_size=3)
                           | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_tampered_cache_never_makes_the_source_return_other_bytes(shard, data):
    """Random edits of a cached index (a value replaced, a list cut, an int nudged): the source reads
    the shard's true samples, from the cache when the edit changed nothing, else after a rebuild."""
    good = cached(shard)
    d = json.loads(json.dumps(good))
    key = data.draw(st.sampled_from(sorted(d)), label="key")
    kind = data.draw(st.sampled_from(["replace", "nudge", "cut"]), label="kind")
    if kind == "replace":
        d[key] = data.draw(json_values, label="value")
    elif kind == "nudge" and key in ("offsets", "sizes"):
        e = data.draw(st.integers(0, len(d[key]) - 1))
        j = data.draw(st.integers(0, len(d[key][e]) - 1))
        d[key][e][j] += data.draw(st.sampled_from([-512, -1, 1, 512, 1024]), label="delta")
    elif isinstance(d[key], list) and d[key]:
        d[key] = d[key][:data.draw(st.integers(0, len(d[key]) - 1), label="keep")]
    rewrite(shard, d)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        src = tar_shards(shard)
    assert list(src) == read_tar_directly(shard)
    if src.index_stats["scanned"]:
        assert d == good or any(beside(shard) in str(w.message) for w in caught) or key in (
            "version", "path", "size", "file_version")
    rewrite(shard, good)


def test_an_unwritable_cache_warns_once_naming_the_folders_and_the_option(tmp_path, monkeypatch):
    shards = write_shards(tmp_path / "s", [2, 3])
    blocked = tmp_path / "a-file"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("SEQLOADER_CACHE", str(blocked / "cache"))
    for s in shards:
        os.makedirs(beside(s))   # a folder where each cache file would go: it cannot be written there
    with pytest.warns(UserWarning, match=r"tar_shards: cannot write the index cache of .*shard-00000\d\.tar \(tried "
                                         r".*/s: .*; .*a-file/cache/tar-index: .*\); every build of this source scans "
                                         r"its shards again .*pass cache_dir= a writable folder, or set "
                                         r"\$SEQLOADER_CACHE to one") as caught:
        src = tar_shards(shards, num_threads=1)
    assert len([w for w in caught if "cannot write" in str(w.message)]) == 1    # once, not per shard
    assert src.index_stats == {"cached": 0, "scanned": 2} and len(src) == 5
    with pytest.warns(UserWarning, match=r"cannot write the index cache of .*\(tried .*a-file/x: .*\).*pass a "
                                         r"writable cache_dir="):
        tar_shards(shards, cache_dir=str(blocked / "x"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tar_shards(shards, use_cache=False)      # asked for no cache: nothing to say


def test_long_builds_report_progress_and_debug_lines_say_what_was_cached(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_progress, "EVERY", 2)
    shards = write_shards(tmp_path / "s", [1, 1, 1, 1, 1])
    tar_shards(shards[:2])
    with caplog.at_level(logging.DEBUG, logger="seqloader"):
        tar_shards(shards, num_threads=1)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert info == ["tar_shards: indexed 2/5 shards (2 cached)", "tar_shards: indexed 4/5 shards (2 cached, 2 scanned)",
                    "tar_shards: indexed 5/5 shards (2 cached, 3 scanned)"]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(m.startswith("tar_shards: ") and "shard-000000.tar: index cached in" in m for m in debug)
    assert any("shard-000004.tar: scanned (1 samples), index cached in" in m for m in debug)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqloader"):
        tar_shards(shards[:1])
    assert not caplog.records                    # short builds say nothing at INFO
