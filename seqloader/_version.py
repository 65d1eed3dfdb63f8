"""The release, in one module that imports nothing: the package root (``seqloader.__version__``),
the loader's state (``saved_with``) and the build (``setup.cfg``: ``version = attr:
seqloader._version.__version__``) all read it here.

While main holds changes beyond the last release (CHANGELOG.md's "Unreleased (X)" entry), the
version is X's development release, ``X.devN``: a state saved with those changes says so in
``saved_with``.

Example:
    >>> __version__.split(".")[:2]
    ['0', '5']
"""

__version__ = "0.5.0.dev0"
