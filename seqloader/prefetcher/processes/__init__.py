"""The process executor's package: worker processes over shared memory (see :mod:`.executor`).

Every folder of ``seqloader/`` is a package with an ``__init__.py``: setuptools' ``find:`` leaves a
folder without one out of the wheel (0.3's wheel had no process executor; ``tests/test_packaging.py``
compares the wheel's files with this tree).
"""
