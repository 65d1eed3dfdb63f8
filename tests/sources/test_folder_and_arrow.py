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
    (tmp_path / "file.png").write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match=r"image_folder: not a directory \(root is the folder of the "
                                                 r"class folders: root/<class>/<file>\): .*file\.png"):
        image_folder(tmp_path / "file.png")
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
    with src._pinned([0]) as decoded:
        cols = decoded[0].cols
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


# -- issue 26: torchvision's listing, and errors that name the file ----------------------------

def _files(root, layout):
    for rel in layout:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rel.encode())


def torchvision_listing(root, extensions):
    """torchvision's ``find_classes`` + ``make_dataset`` (torchvision/datasets/folder.py), for loop-free trees."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = []
    for c, name in enumerate(classes):
        for folder, _, names in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            out += [(os.path.join(folder, n), c) for n in sorted(names) if n.lower().endswith(extensions)]
    return classes, out


def test_image_folder_lists_as_torchvision_does(tmp_path):
    root = tmp_path / "tv"
    _files(root, ["cat/z.png", "cat/a.png", "cat/sub/x.png", "cat/sub-2/y.png", "cat/_0001.png", "cat/.x.png",
                  "dog/b.JPG", ".hidden/h.png", "_under/u.png", "cat/notes.txt"])
    _files(tmp_path / "elsewhere", ["fish/f1.png", "fish/deeper/f0.png"])
    os.symlink(tmp_path / "elsewhere" / "fish", root / "fish")                # a linked class folder
    os.symlink(tmp_path / "elsewhere" / "fish" / "deeper", root / "dog" / "linked")  # a linked sub-folder
    classes, samples = torchvision_listing(str(root), seqloader.sources.folder.IMAGE_EXTENSIONS)
    src = image_folder(root)
    assert src.classes == classes == [".hidden", "_under", "cat", "dog", "fish"]
    assert [p for p in src.paths()] == [p for p, _ in samples] and src.targets == [c for _, c in samples]
    assert [os.path.relpath(p, root) for p in src.paths()][2:7] == [
        "cat/.x.png", "cat/_0001.png", "cat/a.png", "cat/z.png", "cat/sub/x.png"]
    assert src[len(src) - 1] == (b"fish/deeper/f0.png", 4)    # torchvision's order: "fish" before "fish/deeper"


def test_image_folder_follows_links_without_looping(tmp_path):
    root = tmp_path / "loop"
    _files(root, ["a/x.png", "a/b/y.png"])
    os.symlink(root / "a", root / "a" / "b" / "up")      # a link back to a folder above it
    os.symlink(root, root / "a" / "root")                # and to the root itself
    src = image_folder(root)
    assert [os.path.relpath(p, root) for p in src.paths()] == ["a/x.png", "a/b/y.png"]


def test_an_empty_class_folder_raises_torchvisions_error_instead_of_shifting_labels(tmp_path):
    root = tmp_path / "empty"
    _files(root, ["a/x.png", "c/y.png", "b/notes.txt"])
    os.makedirs(root / "d")
    with pytest.raises(FileNotFoundError, match=r"image_folder: Found no valid file for the classes b, d\. Supported "
                                                r"extensions are: \.jpg, .*\.webp \(in .*empty\)"):
        image_folder(root)
    os.rmdir(root / "d")
    assert image_folder(root, extensions=None).classes == ["a", "b", "c"]
    os.makedirs(tmp_path / "none")
    with pytest.raises(FileNotFoundError, match=r"image_folder: Couldn't find any class folder in .*none\."):
        image_folder(tmp_path / "none")


def test_a_file_that_is_not_an_image_is_named_by_the_decode_error(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    import io

    root = tmp_path / "img"
    os.makedirs(root / "cat")
    Image.new("RGB", (2, 2)).save(root / "cat" / "good.jpg")
    (root / "cat" / "bad.jpg").write_text("this is text, not a JPEG")
    src = image_folder(root, transform=lambda b: Image.open(io.BytesIO(b)).size)
    assert src[1] == ((2, 2), 0)
    with pytest.raises(Image.UnidentifiedImageError, match=r"cannot identify image file") as info:
        src[0]
    assert f"image_folder: while transforming {root / 'cat' / 'bad.jpg'} (class 'cat')" in info.value.__notes__


@pytest.mark.parametrize("cut", [0, 7, 200, -1])
def test_a_truncated_arrow_file_is_named(arrow_files, tmp_path, cut):
    path = str(tmp_path / "cut.arrow")
    with open(arrow_files[0], "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:cut])
    with pytest.raises(ValueError, match=r"cut\.arrow is (not an Arrow IPC file|not an Arrow IPC file or is "
                                         r"truncated \(no ARROW1 magic at its end\))"):
        arrow_ipc([arrow_files[1], path])


def test_arrow_files_are_checked_against_the_index_in_each_process(arrow_files):
    src = arrow_ipc(arrow_files)
    src._digests[1] = "0" * 16
    clone = pickle.loads(pickle.dumps(src))
    assert int(clone[0]["i"]) == 0
    with pytest.raises(RuntimeError, match=r"part-1\.arrow changed since it was indexed \(its footer's digest is "
                                           r"[0-9a-f]{16}, the index's 0000000000000000\)"):
        clone[8]
