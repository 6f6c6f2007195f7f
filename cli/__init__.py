"""durkv.cli: the ``durkv`` console script (click). See ``durkv --help``.

The library has no click in it; this package is the only place that does.
"""

from __future__ import annotations

from .main import cli, main

__all__ = ["cli", "main"]
