"""The release, in one module that imports nothing: the package root (``seqloader.__version__``),
the loader's state (``saved_with``) and the build (``setup.cfg``: ``version = attr:
seqloader._version.__version__``) all read it here.

Example:
    >>> __version__.count(".")
    2
"""

__version__ = "0.4.0"
