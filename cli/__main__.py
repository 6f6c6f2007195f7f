"""``python -m durkv.cli`` runs the ``durkv`` command line."""

from .main import main

main()
