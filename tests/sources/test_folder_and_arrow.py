"""``seqloader.image_folder`` (torchvision's layout) and ``seqloader.arrow_ipc`` (Feather v2)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from torch.utils.data import default_convert

import seqloader
from seqloader.sources import arrow_ipc, image_folder
from seqloader.testing import assert_resumes_exactly

from sources_helpers import pa, pq, table

feather = pytest.importorskip("pyarrow.feather")

CLASSES = {"cat": ["c2.png", "c1.jpg"], "dog": ["d1.JPG", "sub/d0.png"], "eel": ["e.bmp", "notes.txt"]}


@pytest.fixture
def root(tmp_path):
    for cls, names in CLASSES.items():
        for name in names:
            path = tmp_path / "root" / cls / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{cls}/{name}".encode())
    return tmp_path / "root"


def test_image_folder_lists_once_sorted_with_classes_from_folder_names(root):
    src = image_folder(root)
    assert src.classes == ["cat", "dog", "eel"] and src.class_to_idx == {"cat": 0, "dog": 1, "eel": 2}
    want = [(b"cat/c1.jpg", 0), (b"cat/c2.png", 0), (b"dog/d1.JPG", 1), (b"dog/sub/d0.png", 1), (b"eel/e.bmp", 2)]
    assert list(src) == want and src.targets == [0, 0, 1, 1, 2]
    assert src.__getitems__([4, 0, -1]) == [want[4], want[0], want[4]]
    assert src.blocks().tolist() == [1, 2, 3, 4, 5]
    assert len(image_folder(root, extensions=None)) == 6
    with pytest.raises(FileNotFoundError, match=r"image_folder: Found no valid file for the classes cat, dog\. "
                                                r"Supported extensions are: \.txt \(in .*root\)"):
        image_folder(root, extensions=["txt"])   # torchvision's error: dropping them would shift the labels
    assert image_folder(root, transform=lambda b: b.decode().upper())[0] == ("CAT/C1.JPG", 0)
    assert list(pickle.loads(pickle.dumps(src))) == want


def test_image_folder_errors(root, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"image_folder: no such file or directory: .*missing"):
        image_folder(tmp_path / "missing")
    (root / "stray.png").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"stray\.png is not inside a class folder"):
        image_folder(root)
    os.remove(root / "stray.png")
    src = image_folder(root)
    (root / "cat" / "c1.jpg").write_bytes(b"changed!")
    os.utime(root / "cat" / "c1.jpg", ns=(1, 1))
    with pytest.raises(RuntimeError, match=r"cat/c1\.jpg changed since it was indexed"):
        src[0]
    with pytest.raises(TypeError, match="root must be a folder path"):
        image_folder(3)


def _decode(item):
    data, label = item
    return np.frombuffer(data.ljust(16, b" ")[:16], dtype=np.uint8).copy(), label


def _make_folder(num_workers, root=None):
    src = image_folder(root, transform=None)
    return seqloader.DataLoader(seqloader.smap(_decode, src), batch_size=2, shuffle=True, seed=0,
                                num_workers=num_workers)


@pytest.mark.mp
def test_image_folder_resumes_exactly(root):
    import functools

    assert_resumes_exactly(functools.partial(_make_folder, root=str(root)), stops=[1, -1])


# -- Arrow IPC -----------------------------------------------------------------------------------

@pytest.fixture
def arrow_files(tmp_path):
    paths = []
    for k, (start, n, chunk) in enumerate([(0, 7, 3), (7, 5, 5)]):
        path = str(tmp_path / f"part-{k}.arrow")
        feather.write_feather(table(start, n), path, chunksize=chunk, compression="uncompressed")
        paths.append(path)
    return paths


def test_arrow_rows_and_batches_equal_pyarrows_read(arrow_files):
    src = arrow_ipc(arrow_files)
    want = [r for p in arrow_files for r in feather.read_table(p).to_pylist()]
    py = (lambda r: {k: v.tolist() if hasattr(v, "tolist") else v for k, v in r.items()})
    assert len(src) == 12 and src.blocks().tolist() == [3, 6, 7, 12]
    assert [py(src[i]) for i in range(12)] == want
    batch = arrow_ipc(arrow_files, columnar=True, columns=["i", "vec"]).__getitems__([11, 0, 5])
    assert batch["i"].tolist() == [11, 0, 5] and batch["vec"].tolist() == [[11.0] * 3, [0.0] * 3, [5.0] * 3]
    assert list(pickle.loads(pickle.dumps(src))[3:5]) is not None


def test_arrow_reads_zero_copy_from_the_memory_map(arrow_files):
    src = arrow_ipc(arrow_files, columns=["i"])
    src[0]
    cols = src._decoded([0])[0]
    assert not cols["i"].flags.owndata and not cols["i"].flags.writeable  # a view of the mapped file


def test_arrow_errors_name_the_file_and_what_to_do(arrow_files, tmp_path):
    stream = tmp_path / "stream.arrow"
    with pa.OSFile(str(stream), "wb") as f, pa.ipc.new_stream(f, table(0, 1).schema) as w:
        w.write_table(table(0, 2))
    with pytest.raises(ValueError, match=r"stream\.arrow is an Arrow IPC \*stream\*.*rewrite it in the IPC file format"):
        arrow_ipc(str(stream))
    pq.write_table(table(0, 2), tmp_path / "x.arrow")
    with pytest.raises(ValueError, match=r"x\.arrow is not an Arrow IPC file"):
        arrow_ipc(str(tmp_path / "x.arrow"))
    other = str(tmp_path / "other.arrow")
    feather.write_feather(table(0, 2).drop_columns(["x"]), other)
    with pytest.raises(ValueError, match=r"column 'x' is in .*part-0\.arrow but not in .*other\.arrow"):
        arrow_ipc([arrow_files[0], other])
    with pytest.raises(FileNotFoundError, match="nope.arrow"):
        arrow_ipc(str(tmp_path / "nope.arrow"))


def _make_arrow(num_workers, paths=None):
    src = arrow_ipc(paths, columns=["i", "x", "vec"], columnar=True)
    return seqloader.DataLoader(src, batch_size=5, shuffle=True, seed=3, num_workers=num_workers,
                                collate_fn=default_convert)


@pytest.mark.mp
def test_arrow_resumes_exactly(arrow_files):
    import functools

    assert_resumes_exactly(functools.partial(_make_arrow, paths=arrow_files), stops=[1, -1])
