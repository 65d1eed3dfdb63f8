"""A short temporary directory for a child process's ``TMPDIR``, removed with what it holds.

Docs examples and notebooks call ``tempfile.mkdtemp()`` as a user would; run with ``TMPDIR`` set
to this directory, their folders go with it. Short (``/tmp/sl-XXXXXXXX``), not pytest's
``tmp_path``: Unix sockets made under ``TMPDIR`` (multiprocessing's forkserver, Ray's) have a
path limit of 107 bytes.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from typing import Iterator


@contextlib.contextmanager
def short_tmpdir() -> Iterator[str]:
    """A new directory under the default temporary directory, removed on exit.

    Example:
        >>> import os
        >>> with short_tmpdir() as tmp:
        ...     os.path.isdir(tmp)
        True
        >>> os.path.exists(tmp)
        False
    """
    tmp = tempfile.mkdtemp(prefix="sl-")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
