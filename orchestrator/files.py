"""Reading a file testbed did not write (a plugin, a graph file): only a regular file, of at
most `limit` bytes, checked on the very descriptor it is read through.

The name is stat'ed before it is opened (opening a FIFO blocks, opening some devices acts)
and fstat'ed after (it may have been swapped in between); callers turn the two refusals into
their own one-line messages. OSError (no such file, no permission, a symlink refused by
`follow=False`) passes through."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink"}


class NotRegular(Exception):
    """The name is not a regular file; `kind` says what it is ("a FIFO", …)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class TooLarge(Exception):
    """The file holds more than the limit; `size` is its size in bytes."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def read_regular(path: str | Path, limit: int, *, follow: bool = True,
                 check: Callable[[os.stat_result], None] | None = None) -> bytes:
    """The file's bytes (at most limit + 1: a file that grew since is seen as too large by the
    caller's own length check). `check(info)`, when given, runs on the descriptor's stat before
    anything is read (an owner's or mode's check)."""
    kind = KINDS.get(stat.S_IFMT((os.stat if follow else os.lstat)(path).st_mode))
    if kind is not None:
        raise NotRegular(kind)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    with os.fdopen(os.open(path, flags), "rb") as handle:
        info = os.fstat(handle.fileno())
        kind = KINDS.get(stat.S_IFMT(info.st_mode))
        if kind is not None:
            raise NotRegular(kind)
        if info.st_size > limit:
            raise TooLarge(info.st_size)
        if check is not None:
            check(info)
        return handle.read(limit + 1)
