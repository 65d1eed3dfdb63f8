"""Sphinx configuration for seqloader's docs (built in CI with ``-W``: every warning is an error)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import seqloader  # noqa: E402  (autodoc must import the package cleanly)

project = "seqloader"
author = "seqloader contributors"
copyright = "2026, seqloader contributors"
release = seqloader.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Google-style docstrings (Args / Returns / Raises / Example:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Public names only; signatures from the code, type hints in the description.
# (No autodoc_default_options: under Sphinx 9 a "members" default overrides the explicit
# :members: lists of the API pages, and the defaults already document no members.)
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True

# ``>>>`` blocks in docstrings are doctests (run by pytest --doctest-modules); keep their prompts.
doctest_global_setup = "import seqloader"
trim_doctest_flags = True

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"seqloader {release}"
html_static_path: list[str] = []

# Cross-references to names outside seqloader (torch, numpy) are not resolved without network
# access (no intersphinx), so missing targets of type hints are not errors.
nitpicky = False
