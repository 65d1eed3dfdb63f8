"""``_sample.sample_digest``: a file's first and last 64 KiB tell apart files whose index is the same.

The same bytes at another path digest the same; a byte changed in the first or the last 64 KiB, or
another size, digests otherwise; a byte changed between them of a larger file is what it cannot see
(docs/data.md, "What seqloader checks, and what it cannot").
"""

from __future__ import annotations

import os
import tempfile

from hypothesis import given, settings, strategies as st

from seqloader.sources._listing import resolve
from seqloader.sources._sample import HEAD_BYTES, TAIL_BYTES, sample_digest
from seqloader.sources._storage import Files


def digest_of(data: bytes, name: str = "f.bin") -> str:
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        return sample_digest(Files("test", resolve("test", folder, (".bin",), None)), 0)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 3 * HEAD_BYTES), seed=st.integers(0, 2**32 - 1), where=st.floats(0, 1))
def test_the_same_bytes_anywhere_digest_the_same_and_a_changed_end_otherwise(size, seed, where):
    import numpy as np

    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    d = digest_of(data)
    assert digest_of(data, "other.bin") == d  # another folder, another name: the same bytes
    k = min(size - 1, int(where * size))
    flipped = data[:k] + bytes([data[k] ^ 1]) + data[k + 1:]
    seen = k < HEAD_BYTES or k >= size - TAIL_BYTES
    assert (digest_of(flipped) != d) == seen
    assert digest_of(data + b"\0") != d
