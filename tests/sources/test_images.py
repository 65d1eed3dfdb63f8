"""decode_image and ImageDecoder: both decoders give PIL's arrays, the choice is explicit, and
tar shards of JPEGs decoded by simplejpeg on thread workers resume exactly."""

from __future__ import annotations

import io
import logging
import pickle
import sys
import tarfile
import threading

import numpy as np
import pytest
import torch

import seqloader
from seqloader.sources import images
from seqloader.sources.images import ImageDecoder, decode_image
from seqloader.testing import assert_resumes_exactly

PIL_Image = pytest.importorskip("PIL.Image")
needs_simplejpeg = pytest.mark.skipif(not images._simplejpeg_installed(),
                                      reason="simplejpeg is not installed (the images extra)")


def pixels(h: int = 24, w: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, rng.integers(0, 256, (h, w))], -1).astype(np.uint8)


def encode(arr: np.ndarray, fmt: str = "JPEG", **kw: object) -> bytes:
    buf = io.BytesIO()
    PIL_Image.fromarray(arr).save(buf, format=fmt, **kw)
    return buf.getvalue()


def pil_reference(data: bytes, mode: str) -> np.ndarray:
    with PIL_Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert(mode))


JPEGS = {
    "baseline 4:4:4": encode(pixels(), quality=90, subsampling=0),
    "baseline 4:2:0": encode(pixels(), quality=90, subsampling=2),
    "progressive": encode(pixels(), quality=80, progressive=True),
    "gray": encode(pixels()[..., 0]),
    "odd size": encode(pixels(17, 31), quality=75),
}


@pytest.fixture
def without_simplejpeg(monkeypatch):
    """simplejpeg made unimportable (as in an environment without the images extra)."""
    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    images._simplejpeg_installed.cache_clear()
    yield
    images._simplejpeg_installed.cache_clear()


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("decoder", ["auto", "simplejpeg", "pil"])
@pytest.mark.parametrize("name", list(JPEGS))
def test_every_decoder_gives_pils_shape_dtype_and_pixels(name, decoder, mode):
    if decoder == "simplejpeg" and not images._simplejpeg_installed():
        pytest.skip("simplejpeg is not installed (the images extra)")
    data = JPEGS[name]
    ref = pil_reference(data, mode)
    out = decode_image(data, mode=mode, decoder=decoder)
    assert out.shape == ref.shape and out.dtype == np.uint8
    assert out.flags.writeable and out.flags.c_contiguous
    # equal on the pinned builds; another libjpeg build may differ by a few levels (documented)
    assert np.abs(out.astype(int) - ref.astype(int)).max() <= 2
    assert decode_image(memoryview(data), mode=mode, decoder=decoder).shape == ref.shape


@needs_simplejpeg
def test_non_jpegs_go_to_pil_whatever_the_decoder():
    arr = pixels(9, 7)
    for fmt in ("PNG", "BMP"):
        data = encode(arr, fmt)
        for decoder in ("auto", "simplejpeg"):
            assert np.array_equal(decode_image(data, decoder=decoder), arr)
            assert np.array_equal(ImageDecoder(decoder)(data), arr)


@needs_simplejpeg
def test_auto_resolves_to_simplejpeg_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="seqloader"):
        dec = ImageDecoder()
    assert dec.jpeg == "simplejpeg" and repr(dec) == "ImageDecoder(jpeg='simplejpeg', mode='RGB')"
    assert "decodes JPEGs with simplejpeg" in caplog.text
    assert np.array_equal(dec(JPEGS["baseline 4:2:0"]), decode_image(JPEGS["baseline 4:2:0"], decoder="simplejpeg"))


def test_without_simplejpeg_asking_for_it_names_the_extra_and_auto_says_it_uses_pil(without_simplejpeg, caplog):
    with pytest.raises(ImportError, match=r"decode_image: needs the optional package 'simplejpeg'; "
                                          r"install it with `pip install seqloader\[images\]`"):
        decode_image(JPEGS["gray"], decoder="simplejpeg")
    with pytest.raises(ImportError, match=r"ImageDecoder: .*seqloader\[images\]"):
        ImageDecoder("simplejpeg")
    with caplog.at_level(logging.INFO, logger="seqloader"):
        dec = ImageDecoder("auto")
    assert dec.jpeg == "pil" and "simplejpeg is not installed" in caplog.text
    assert np.array_equal(dec(JPEGS["gray"]), pil_reference(JPEGS["gray"], "RGB"))


@needs_simplejpeg
def test_an_unpickled_decoder_keeps_its_choice_or_raises(monkeypatch):
    blob = pickle.dumps(ImageDecoder("auto"))
    assert pickle.loads(blob).jpeg == "simplejpeg"
    monkeypatch.setitem(sys.modules, "simplejpeg", None)   # a worker without the extra: no silent PIL
    with pytest.raises(ImportError, match=r"seqloader\[images\]"):
        pickle.loads(blob)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match=r"decode_image: decoder must be one of 'auto', 'simplejpeg', 'pil' \(got 'PIL'\)"):
        decode_image(JPEGS["gray"], decoder="PIL")
    with pytest.raises(ValueError, match=r"decode_image: mode must be one of 'RGB', 'L' \(got 'RGBA'\)"):
        decode_image(JPEGS["gray"], mode="RGBA")
    with pytest.raises(TypeError, match=r"decode_image: data must be bytes \(got str\)"):
        decode_image("a.jpg")
    with pytest.raises(ValueError, match=r"ImageDecoder: decoder must be one of"):
        ImageDecoder(decoder=None)


@pytest.mark.parametrize("decoder", ["auto", "simplejpeg", "pil"])
@pytest.mark.parametrize("bad", ["truncated", "empty", "garbage", "jpeg magic then garbage"])
def test_bad_bytes_raise_an_oserror_naming_the_library_and_the_size(decoder, bad):
    if decoder == "simplejpeg" and not images._simplejpeg_installed():
        pytest.skip("simplejpeg is not installed (the images extra)")
    data = {"truncated": JPEGS["baseline 4:4:4"][:60], "empty": b"", "garbage": b"hello world",
            "jpeg magic then garbage": b"\xff\xd8\xff" + b"x" * 10}[bad]
    library = "simplejpeg" if decoder == "simplejpeg" and data[:3] == b"\xff\xd8\xff" else "PIL"
    with pytest.raises(OSError, match=rf"^decode_image: {library} could not decode these {len(data)} bytes \(") as info:
        decode_image(data, decoder=decoder)
    assert isinstance(info.value, ValueError) and isinstance(info.value, images.ImageDecodeError)
    assert "BytesIO object at" not in str(info.value)
    assert info.value.__cause__ is not None   # the library's own error


def _without_end_marker(jpeg: bytes) -> bytes:
    assert jpeg[-2:] == b"\xff\xd9"
    return jpeg[:-2] + b"\x00" * 8   # the end marker lost, the file padded (as some writers leave it)


@needs_simplejpeg
def test_a_jpeg_without_its_end_marker_decodes_as_pil_decodes_it_unless_simplejpeg_is_asked_for():
    data = _without_end_marker(JPEGS["baseline 4:4:4"])
    expected = decode_image(data, decoder="pil")
    assert np.array_equal(decode_image(data), expected)                  # auto: PIL takes simplejpeg's refusal
    assert np.array_equal(images.ImageDecoder()(data), expected)
    assert np.array_equal(pickle.loads(pickle.dumps(images.ImageDecoder()))(data), expected)
    with pytest.raises(OSError, match="simplejpeg could not decode .*Premature end of JPEG file"):
        decode_image(data, decoder="simplejpeg")
    with pytest.raises(OSError, match="simplejpeg could not decode"):
        images.ImageDecoder("simplejpeg")(data)


@needs_simplejpeg
def test_simplejpeg_releases_the_gil_while_it_decodes():
    """Another thread runs while a decode is under way. With a switch interval of 60 s, the only
    way this thread gets the GIL before the decoding thread is done is that the decoder gives it
    up: nothing here depends on how long a decode takes."""
    data = encode(pixels(512, 512), quality=90)
    started, state = threading.Event(), {"decoding": False}

    def work():
        state["decoding"] = True
        started.set()
        for _ in range(50):   # (the thread holds the GIL from here on unless the decoder releases it)
            decode_image(data, decoder="simplejpeg")
        state["decoding"] = False

    old = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        t = threading.Thread(target=work)
        t.start()
        started.wait()
        seen_during_decode = state["decoding"]
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert seen_during_decode


def _write_jpeg_shards(folder, shards: int = 3, per: int = 12) -> None:
    folder.mkdir()
    j = 0
    for s in range(shards):
        with tarfile.open(folder / f"shard-{s:03d}.tar", "w") as tf:
            for _ in range(per):
                for ext, data in (("jpg", encode(pixels(16, 20, seed=j), quality=85)), ("cls", str(j % 5).encode())):
                    info = tarfile.TarInfo(f"{j:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                j += 1


_DECODE = ImageDecoder("simplejpeg") if images._simplejpeg_installed() else None


def _decode_sample(sample: dict) -> tuple[torch.Tensor, int]:   # module level: picklable for spawn
    assert _DECODE is not None
    return torch.from_numpy(_DECODE(sample["jpg"])), int(sample["cls"])


@needs_simplejpeg
def test_tar_shards_of_jpegs_decoded_by_simplejpeg_on_thread_workers_resume_exactly(tmp_path):
    _write_jpeg_shards(tmp_path / "shards")
    src = seqloader.tar_shards(str(tmp_path / "shards"), transform=_decode_sample)
    by_pil = seqloader.tar_shards(str(tmp_path / "shards"),
                                  transform=lambda s: (torch.from_numpy(decode_image(s["jpg"], decoder="pil")),
                                                       int(s["cls"])))
    assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(src, by_pil))   # the pinned builds

    def make(num_workers: int):
        extra = {"worker_method": "thread"} if num_workers else {}
        return seqloader.DataLoader(src, batch_size=5, shuffle=True, seed=3, num_workers=num_workers, **extra)

    first = next(iter(make(2)))
    assert first[0].shape == (5, 16, 20, 3) and first[0].dtype == torch.uint8
    assert_resumes_exactly(make, stops=[1, 4, -1])
