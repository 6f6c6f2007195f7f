"""The ``>>>`` examples in the docstrings are the reference (STYLE.md): they run here.

``pytest --doctest-modules kernel`` cannot collect them: the folder ``kernel/`` is the
package ``durkv`` (setup.py), so pytest would import ``kernel.store.index`` and its
relative imports would miss. Modules are imported by their real names instead; one whose
optional extra is not installed (``durkv[langgraph]``, ``durkv[s3]``) is skipped, named.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import durkv

PACKAGES = ("durkv", "durkv.backends", "durkv.cli")
OPTIONAL = ("langgraph", "langchain_core", "boto3", "botocore")   # the extras' imports


def _module_names() -> list[str]:
    names = set(PACKAGES)
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        for info in pkgutil.walk_packages(path, package + "."):
            if not info.name.rsplit(".", 1)[-1].startswith("_"):
                names.add(info.name)
    return sorted(names)


MODULES = _module_names()


def _tests(name: str) -> list[doctest.DocTest]:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if exc.name and exc.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name} (an optional extra)")
        raise
    return [t for t in doctest.DocTestFinder().find(module, name) if t.examples]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)         # an example that writes a file writes it here
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in _tests(name):
        runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} examples in {name} failed (output above)"


def test_the_examples_are_found():
    """So that a change to the collection above cannot make the test pass on nothing."""
    found = 0
    for name in MODULES:
        try:
            found += sum(len(t.examples) > 0 for t in _tests(name))
        except pytest.skip.Exception:
            continue
    # 29 docstrings (88 examples) when this was written: fewer means examples were lost
    assert found >= 29, f"only {found} docstrings with examples found in {PACKAGES}"
    assert durkv.open.__module__ == "durkv"
