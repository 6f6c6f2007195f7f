"""Kept for compatibility: the store's index is :mod:`durkv.store.index`.

``durkv.index`` was its home before the store became a package (issue 8); code and
tests that import it keep working. New code imports :mod:`durkv.store.index`.
"""

from .store.index import *  # noqa: F401,F403
