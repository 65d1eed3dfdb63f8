"""Image bytes to pixels: :func:`decode_image` and :class:`ImageDecoder`.

JPEGs (bytes starting ``FF D8 FF``) are decoded by ``simplejpeg`` (libjpeg-turbo) when the
decoder asks for it, every other format by PIL. ``simplejpeg`` parses and decodes in C with
the GIL released, so thread workers and threads inside worker processes decode in parallel;
PIL parses a JPEG's headers in Python (``Image.open``), which holds the GIL.

The choice is explicit: ``decoder="simplejpeg"`` (JPEGs by simplejpeg, an ``ImportError``
naming the ``images`` extra when it is not installed), ``decoder="pil"`` (everything by PIL),
or ``decoder="auto"`` (simplejpeg when it is installed, else PIL). An :class:`ImageDecoder`
resolves ``"auto"`` once, when it is made, and says what it chose (``.jpeg`` and its ``repr``,
and an INFO line on the ``seqloader`` logger); a worker process that unpickles it uses that
choice or raises, so every worker decodes alike.

Both paths give what ``numpy.asarray(PIL.Image.open(f).convert(mode))`` gives: ``(H, W, 3)``
uint8 for ``mode="RGB"``, ``(H, W)`` uint8 for ``mode="L"`` (PIL's luma: ``(19595 R + 38470 G
+ 7471 B + 2**15) >> 16``), writable and C-contiguous. The pixels are those of the libjpeg
each library was built with: with Pillow 13 (libjpeg-turbo 3.2) and simplejpeg 1.9 they are
equal, bit for bit, for baseline and progressive YCbCr and gray JPEGs (CMYK ones: within one
level); other builds may differ by a few levels, so pick one decoder for a run you resume.
Neither applies EXIF orientation (PIL's ``Image.open`` does not either).

Where the two libraries differ on bad input, and what seqloader makes of it: simplejpeg raises
``ValueError`` where PIL raises ``OSError``, and simplejpeg refuses a JPEG that lacks only its end
marker (``FF D9``), which PIL decodes. Both become one :class:`ImageDecodeError`, an ``OSError``
(what a PIL user's ``except OSError`` catches) that is also a ``ValueError``, whose message names
the library and the byte size (``decode_image: PIL could not decode these 0 bytes (...)``). With
``decoder="auto"``, a JPEG simplejpeg refuses is handed to PIL, which decodes it (the pixels are
PIL's) or raises; ``decoder="simplejpeg"`` keeps simplejpeg's refusal. A truncated JPEG is refused
by both.
"""

from __future__ import annotations

import functools
import io
import re
from typing import Any

import numpy as np

from seqloader.sources._process import optional_import
from seqloader.sources._progress import log

__all__ = ["ImageDecodeError", "ImageDecoder", "decode_image", "DECODERS", "MODES"]

_OP = "decode_image"
#: The values of ``decoder=``.
DECODERS = ("auto", "simplejpeg", "pil")
#: The values of ``mode=``.
MODES = ("RGB", "L")
_JPEG_MAGIC = b"\xff\xd8\xff"
_BUFFER_REPR = re.compile(r" <_io\.BytesIO object at 0x[0-9a-fA-F]+>")


@functools.lru_cache(maxsize=None)
def _simplejpeg_installed() -> bool:
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return False
    return True


def _resolve(decoder: str, op: str) -> str:
    """The library that decodes JPEGs for ``decoder``: ``"simplejpeg"`` or ``"pil"``."""
    if not isinstance(decoder, str) or decoder not in DECODERS:
        raise ValueError(f"{op}: decoder must be one of {', '.join(map(repr, DECODERS))} (got {decoder!r})")
    if decoder == "auto":
        return "simplejpeg" if _simplejpeg_installed() else "pil"
    if decoder == "simplejpeg":
        optional_import("simplejpeg", "images", op)   # the ImportError names the extra
    return decoder


def _check_mode(mode: str, op: str) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"{op}: mode must be one of {', '.join(map(repr, MODES))} (got {mode!r})")
    return mode


def _luma(rgb: np.ndarray) -> np.ndarray:
    """PIL's ``convert("L")`` of ``(H, W, 3)`` uint8 RGB (its integer ITU-R 601-2 luma)."""
    r, g, b = (rgb[..., c].astype(np.uint32) for c in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)


class ImageDecodeError(OSError, ValueError):
    """Encoded bytes that could not be decoded: an ``OSError``, as PIL raises (``except OSError``
    catches it whichever library refused), and a ``ValueError``, as simplejpeg raises. The message
    names the byte size and the library; the library's own error is the ``__cause__``."""


def _refused(data: Any, library: str, exc: BaseException, hint: str) -> ImageDecodeError:
    reason = _BUFFER_REPR.sub("", str(exc))   # PIL names the in-memory file it was given: say nothing of it
    return ImageDecodeError(f"{_OP}: {library} could not decode these {len(data)} bytes ({reason}); {hint}")


def _with_simplejpeg(data: Any, mode: str) -> np.ndarray:
    import simplejpeg

    try:
        rgb = simplejpeg.decode_jpeg(data, colorspace="RGB")   # the GIL is released while it works
    except ValueError as exc:
        raise _refused(data, "simplejpeg", exc, "a corrupt or truncated JPEG? (PIL decodes a JPEG "
                       "that lacks only its end marker: decoder='auto' or 'pil')") from exc
    return _luma(rgb) if mode == "L" else np.ascontiguousarray(rgb)


def _with_pil(data: Any, mode: str) -> np.ndarray:
    image = optional_import("PIL.Image", "images", _OP)
    try:
        with image.open(io.BytesIO(data)) as img:
            pixels = np.array(img.convert(mode))   # (a writable copy)
    except (OSError, ValueError, SyntaxError) as exc:   # PIL's UnidentifiedImageError is an OSError
        raise _refused(data, "PIL", exc, "a corrupt or truncated image, or not an image?") from exc
    return pixels


def _decode(data: Any, mode: str, jpeg: str, auto: bool) -> np.ndarray:
    """``jpeg``: the library for JPEGs; ``auto``: a JPEG simplejpeg refuses goes to PIL, which decides."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{_OP}: data must be bytes (got {type(data).__name__})")
    if jpeg == "simplejpeg" and bytes(data[:3]) == _JPEG_MAGIC:
        if not auto:
            return _with_simplejpeg(data, mode)
        try:
            return _with_simplejpeg(data, mode)
        except ImageDecodeError as refused:
            try:
                return _with_pil(data, mode)
            except ImageDecodeError as exc:
                raise exc from refused   # PIL's refusal, with simplejpeg's as its cause
    return _with_pil(data, mode)


def decode_image(data: bytes, *, mode: str = "RGB", decoder: str = "auto") -> np.ndarray:
    """The pixels of an encoded image: JPEGs by ``simplejpeg`` (GIL released), others by PIL.

    Args:
        data: the encoded image (JPEG, PNG, or any format PIL reads), e.g. a tar sample's
            ``sample["jpg"]``.
        mode: ``"RGB"`` (``(H, W, 3)`` uint8) or ``"L"`` (``(H, W)`` uint8, PIL's luma).
        decoder: ``"auto"`` (simplejpeg for JPEGs when it is installed, else PIL),
            ``"simplejpeg"`` (JPEGs by simplejpeg; other formats still by PIL) or ``"pil"``.
            See the module docstring for when their pixels may differ. :class:`ImageDecoder`
            resolves ``"auto"`` once and says what it chose.

    Returns:
        A writable, C-contiguous uint8 array: ``numpy.asarray(PIL.Image.open(...).convert(mode))``.

    Raises:
        ValueError: ``mode`` or ``decoder`` is not one of its values.
        ImportError: ``decoder="simplejpeg"`` without simplejpeg, or a non-JPEG without PIL
            (``pip install seqloader[images]``).
        TypeError: ``data`` is not bytes.
        ImageDecodeError: ``data`` cannot be decoded (empty, not an image, truncated or corrupt):
            an ``OSError``, as PIL's errors are, and a ``ValueError``, as simplejpeg's are; the
            message names the byte size and the library. With ``decoder="auto"`` a JPEG that
            simplejpeg refuses (one that lacks only its end marker, say) goes to PIL, which
            decodes it or raises; with ``decoder="simplejpeg"`` simplejpeg's refusal is final.

    Example:
        >>> import io, numpy as np
        >>> from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (4, 2), (255, 0, 0)).save(buf, "JPEG", quality=95)
        >>> pixels = decode_image(buf.getvalue())
        >>> pixels.shape, pixels.dtype, bool((pixels == decode_image(buf.getvalue(), decoder="pil")).all())
        ((2, 4, 3), dtype('uint8'), True)
        >>> decode_image(buf.getvalue(), mode="L").shape
        (2, 4)
        >>> decode_image(buf.getvalue(), decoder="turbo")
        Traceback (most recent call last):
        ValueError: decode_image: decoder must be one of 'auto', 'simplejpeg', 'pil' (got 'turbo')
        >>> decode_image(b"")
        Traceback (most recent call last):
        seqloader.sources.images.ImageDecodeError: decode_image: PIL could not decode these 0 bytes (...)...
    """
    return _decode(data, _check_mode(mode, _OP), _resolve(decoder, _OP), decoder == "auto")


class ImageDecoder:
    """:func:`decode_image` as a picklable callable, with ``decoder="auto"`` resolved once.

    Make it in the training process and pass it (or a function calling it) as a source's
    ``transform``: ``.jpeg`` says which library decodes JPEGs (``"simplejpeg"`` or ``"pil"``),
    its ``repr`` too, and making one with ``"auto"`` logs the choice (INFO, ``seqloader``
    logger). Unpickled in a worker process, it decodes with that library or raises the
    ``ImportError`` naming the ``images`` extra: never silently with the other one.

    Args:
        decoder: ``"auto"``, ``"simplejpeg"`` or ``"pil"`` (see :func:`decode_image`).
        mode: ``"RGB"`` or ``"L"``.

    Raises:
        ValueError: ``decoder`` or ``mode`` is not one of its values.
        ImportError: ``decoder="simplejpeg"`` and simplejpeg is not installed.

    Example:
        >>> import io, pickle
        >>> from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (3, 5), (0, 128, 255)).save(buf, "PNG")
        >>> decode = ImageDecoder("pil")
        >>> decode, decode(buf.getvalue()).shape
        (ImageDecoder(jpeg='pil', mode='RGB'), (5, 3, 3))
        >>> pickle.loads(pickle.dumps(ImageDecoder())).jpeg in ("simplejpeg", "pil")
        True
        >>> ImageDecoder(mode="RGBA")
        Traceback (most recent call last):
        ValueError: ImageDecoder: mode must be one of 'RGB', 'L' (got 'RGBA')
    """

    __slots__ = ("jpeg", "mode", "auto")

    def __init__(self, decoder: str = "auto", mode: str = "RGB"):
        self.mode = _check_mode(mode, "ImageDecoder")
        self.jpeg = _resolve(decoder, "ImageDecoder")
        self.auto = decoder == "auto"   # a JPEG simplejpeg refuses goes to PIL, as decode_image's
        if decoder == "auto":
            log.info("ImageDecoder: decoder='auto' decodes JPEGs with %s%s", self.jpeg,
                     "" if self.jpeg == "simplejpeg" else " (simplejpeg is not installed: "
                     "`pip install seqloader[images]` for a decoder that releases the GIL)")

    def __call__(self, data: bytes) -> np.ndarray:
        return _decode(data, self.mode, self.jpeg, self.auto)

    def __getstate__(self) -> dict[str, Any]:
        return {"jpeg": self.jpeg, "mode": self.mode, "auto": self.auto}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.mode, self.auto = state["mode"], state.get("auto", False)
        self.jpeg = _resolve(state["jpeg"], "ImageDecoder")   # a worker without simplejpeg raises here

    def __repr__(self) -> str:
        return f"ImageDecoder(jpeg={self.jpeg!r}, mode={self.mode!r})"
