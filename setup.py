"""Build durkv: the Python packages plus the C segment log compiled through cffi.

Metadata lives in pyproject.toml; this file exists for the package-dir mapping,
``cffi_modules`` (cffi's setuptools hook) and the small CPython extensions
``durkv._listprefix``, ``durkv._journalscan``, ``durkv._recpack``,
``durkv._commitframe``, ``durkv._commitpath``, ``durkv._chanenc``, ``durkv._lgcommit``,
``durkv._msgunpack``, ``durkv._msgfields``, ``durkv._heldcall`` and ``durkv._zstdheld``,
which pyproject.toml cannot express.
"""

import sys
from pathlib import Path

from setuptools import Extension, setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "csrc"))
from build_ffi import COMPILE_ARGS  # noqa: E402 - the C flags, DURKV_WERROR read once

setup(
    packages=["durkv", "durkv.store", "durkv.runtime", "durkv.backends", "durkv.backends.s3",
              "durkv.cli"],
    package_dir={"durkv": "kernel", "durkv.store": "kernel/store",
                 "durkv.runtime": "kernel/runtime", "durkv.backends": "backends",
                 "durkv.backends.s3": "backends/s3", "durkv.cli": "cli"},
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    ext_modules=[Extension("durkv._listprefix", ["csrc/listprefix.c"],
                           depends=["csrc/plaincopy.h"], extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._journalscan", ["csrc/journalscan.c"],
                           depends=["csrc/asciitext.h", "csrc/prefault.h", "csrc/seglog.h"],
                           extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._recpack", ["csrc/recpack.c"],
                           extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._commitframe", ["csrc/commitframe.c"],
                           extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._commitpath", ["csrc/commitpath.c"],
                           extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._lgcommit", ["csrc/lgcommit.c"],
                           extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._chanenc", ["csrc/chanenc.c"],
                           depends=["csrc/plaincopy.h"], extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._msgunpack", ["csrc/msgunpack.c"],
                           depends=["csrc/asciitext.h", "csrc/plaincopy.h"],
                           extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._msgfields", ["csrc/msgfields.c"],
                           depends=["csrc/plaincopy.h"], extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._heldcall", ["csrc/heldcall.c"],
                           extra_compile_args=COMPILE_ARGS),
                 Extension("durkv._zstdheld", ["csrc/zstdheld.c"], libraries=["dl"],
                           extra_compile_args=COMPILE_ARGS)],
    zip_safe=False,
)
