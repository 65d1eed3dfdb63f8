"""Every packing test writes its index files into its own temporary folder."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _index_files_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQLOADER_CACHE", str(tmp_path / "cache"))
