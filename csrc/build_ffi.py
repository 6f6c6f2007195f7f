"""cffi builder for durkv._seglog (out-of-line API mode).

setup.py names it in ``cffi_modules``; ``python csrc/build_ffi.py`` builds in place for
a quick try. ``DURKV_WERROR=1`` turns warnings into errors (CI): COMPILE_ARGS is read
here once, for every C file of the package (setup.py passes it to ``durkv._listprefix``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
SOURCES = ["crc32c.c", "format.c", "seglog.c", "read.c", "open.c", "commit.c", "verify.c",
           "vrefs.c", "head.c", "segfd.c", "damage.c", "rawio.c", "util.c", "recover_open.c",
           "lsnarray.c"]


def _cdef() -> str:
    """The API declarations of seglog.h, minus what cffi's cdef cannot parse."""
    text = (HERE / "seglog.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    keep = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#define DKV_") and len(s.split()) >= 3:
            keep.append(f"#define {s.split()[1]} ...")
        elif s.startswith("#") or "#include" in s:
            continue
        else:
            keep.append(line)
    return "\n".join(keep)


ffibuilder = FFI()
# the progress callback of dkv_verify/dkv_recover, implemented in Python (durkv.log):
# extern "Python" needs no libffi closure
ffibuilder.cdef(_cdef() + '\nextern "Python" void dkv_py_progress(void *, uint64_t, uint64_t);\n')

COMPILE_ARGS = ["-O2", "-Wall", "-Wextra", "-std=gnu11"] + (
    ["-Werror"] if os.environ.get("DURKV_WERROR") == "1" else [])

# the writers' shared state (FORMAT.md §12), kept apart from SOURCES' line
MULTIWRITER_SOURCES = ["wshm.c"]

ffibuilder.set_source(
    "durkv._seglog",
    '#include "seglog.h"',
    sources=[os.path.relpath(HERE / s) for s in SOURCES + MULTIWRITER_SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=COMPILE_ARGS,
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
