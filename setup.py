"""Build durkv: the Python packages plus the C segment log compiled through cffi.

Metadata lives in pyproject.toml; this file exists for the package-dir mapping and
``cffi_modules`` (cffi's setuptools hook), which pyproject.toml cannot express.
"""

from setuptools import setup

setup(
    packages=["durkv", "durkv.backends", "durkv.cli"],
    package_dir={"durkv": "kernel", "durkv.backends": "backends", "durkv.cli": "cli"},
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    zip_safe=False,
)
