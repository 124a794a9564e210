"""The version of the helper code every compiled kernel calls into.

A kernel module calls ``lib.*`` helpers (:mod:`.kernel_lib` and the modules it pulls in)
and the size functions of :mod:`simaccel.runtime.sizes`; numba inlines them into the
kernel's machine code. Both of the kernel cache's layers key on the kernel module's own
text alone (numba's index on its source file, simaccel's native objects on its hash), so
a cache directory filled by an older simaccel would hand out kernels built with the old
helpers. Every kernel module therefore names the digest of the helpers' source
(:data:`HELPERS_DIGEST`, a comment in its header): a helper change makes every kernel
a new module, compiled afresh.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

_CODEGEN = Path(__file__).resolve().parent

#: the source files kernels' machine code is built from besides their own module: the
#: ``*_lib`` helpers, the special functions and the extensions kernel_lib pulls in, the
#: parallel loops' naming (a change there must not reuse kernels cached under the old
#: names), the size functions
HELPER_FILES = tuple(sorted({*_CODEGEN.glob("*_lib.py"), *_CODEGEN.glob("special_*.py"),
                             _CODEGEN / "kernel_ext.py", _CODEGEN / "parfor_names.py"})) + (
    _CODEGEN.parent / "runtime" / "sizes.py",)


def helpers_digest(files: tuple[Path, ...] = HELPER_FILES) -> str:
    """sha256 (16 hex digits) of the helper files' contents, in order."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


#: the helpers' digest of this installation
HELPERS_DIGEST = helpers_digest()
