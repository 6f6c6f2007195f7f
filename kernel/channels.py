"""Kept for compatibility: the commit-payload codec is :mod:`durkv.payload`.

``durkv.channels`` was its name before the store became a package (issue 8); code
and tests that import it keep working. New code imports :mod:`durkv.payload`.
"""

from .payload import *  # noqa: F401,F403
from .payload import __all__  # noqa: F401
