"""The tcp transport's native data path (dataplane.c), loaded with ctypes.

setup.sh builds `libdataplane.so` from `dataplane.c` beside this file (`build()` does the
same, with the C compiler every supported machine has); the agent wheel carries it. Without
it the tcp transport runs its Python data path (agent/transports/tcp.py), at about twice the
CPU per byte; `TESTBED_NATIVE=0` asks for that path explicitly.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("dataplane.c")
LIBRARY = Path(__file__).with_name("libdataplane.so")
CFLAGS = ["-O3", "-shared", "-fPIC", "-pthread", "-Wall"]

_lib: ctypes.CDLL | None = None
_tried = False

_P = ctypes.c_void_p
_I32, _I64, _D = ctypes.c_int32, ctypes.c_int64, ctypes.c_double
_SIGNATURES = {
    "dp_new": (_P, [_I32, _P, _I64, _I64, _I64, _D, _D, ctypes.c_int, _P]),
    "dp_connection": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int]),
    "dp_plan": (None, [_P, ctypes.c_int] + [_P] * 16 + [ctypes.c_int] + [_P] * 5),
    "dp_iterate": (ctypes.c_int, [_P, _I64]),
    "dp_cancel": (None, [_P]),
    "dp_serve": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int]),
    "dp_set_rendezvous": (None, [_P, ctypes.c_int]),
    "dp_meets": (None, [_P, _P]),
    "dp_heard": (None, [_P, _I64, ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    "dp_error": (ctypes.c_char_p, [_P]),
    "dp_error_rank": (ctypes.c_int, [_P]),
    "dp_ready": (ctypes.c_int, [_P, ctypes.c_int]),
    "dp_close": (ctypes.c_int, [_P]),
    "dp_stop": (None, [_P]),
    "dp_attach": (None, [_P, ctypes.c_int, ctypes.c_int]),
    "dp_unreachable": (None, [_P, ctypes.c_int, ctypes.c_char_p]),
    "dp_set_link_rate": (None, [_P, _D]),
    "dp_acks_due": (ctypes.c_int, [_P, ctypes.c_int]),
}


def build(target: Path = LIBRARY) -> None:
    """Compile dataplane.c into `target` (raises CalledProcessError with the compiler's words)."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    subprocess.run(["gcc", *CFLAGS, "-o", str(temporary), str(SOURCE)], check=True, capture_output=True, text=True)
    os.replace(temporary, target)


def build_if_stale() -> bool:
    """Build the library when it is missing or older than its source; True if it built."""
    if LIBRARY.exists() and LIBRARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return False
    build()
    return True


def library() -> ctypes.CDLL | None:
    """The loaded library, or None when it is not built (or TESTBED_NATIVE=0)."""
    global _lib, _tried
    if os.environ.get("TESTBED_NATIVE", "1") == "0":
        return None
    if not _tried:
        _tried = True
        try:
            lib = ctypes.CDLL(str(LIBRARY))
        except OSError:
            return None
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        _lib = lib
    return _lib


def available() -> bool:
    return library() is not None
