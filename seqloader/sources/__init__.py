"""L0 sources: data on disk or object storage as lazy, position-addressable sequences.

Every source is a :class:`Source` built from an *index* (row counts of Parquet row groups and
Arrow record batches, member offsets of tar shards, a sorted listing of files), so item ``p`` is
found by arithmetic and read directly: shuffling, sharding, mixing and resuming seek instead of
replaying. Sources import no torch; the optional libraries they read with (pyarrow, fsspec)
are imported when a source is built, with an ``ImportError`` that names the extra to install.
The public names are re-exported by :mod:`seqloader` (``seqloader.parquet(...)``).
"""

from seqloader.sources.arrow import arrow_ipc
from seqloader.sources.base import Source
from seqloader.sources.fingerprint import check_same_files, describe_files
from seqloader.sources.folder import image_folder
from seqloader.sources.images import ImageDecoder, decode_image
from seqloader.sources.parquet_files import parquet
from seqloader.sources.tar import tar_shards

__all__ = ["ImageDecoder", "Source", "arrow_ipc", "check_same_files", "decode_image", "describe_files", "image_folder",
           "parquet", "tar_shards"]
