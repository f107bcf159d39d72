"""Read a user-named text file with bounds, so bad input cannot hurt a shared login node.

Specs, profiles, input lists and checksum catalogs are read whole; ``list_file: /dev/zero``
would otherwise eat memory until the node kills something. Each is read only if it is a
regular file below a size limit, and a file that is not UTF-8 text is named with the line
of its first bad byte.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

MiB = 1024 * 1024
YAML_MAX_BYTES = 64 * MiB     # a spec listing 10^5 files inline is about 10 MB
LIST_MAX_BYTES = 512 * MiB    # a list file or catalog of 10^6 entries is about 150 MB


class TextFileError(Exception):
    """Why a file cannot be read as text: a message and, where known, the line."""

    def __init__(self, message: str, line: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.line = line


def read_text(path: os.PathLike[str] | str, limit: int) -> str:
    """The file's text; :class:`TextFileError` for a non-regular file, one over ``limit``
    bytes, a NUL byte or bytes that are not UTF-8."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise TextFileError("it is not a regular file (a device, FIFO or directory cannot be read "
                                    "as a list)")
            if st.st_size > limit:
                raise TextFileError(f"it holds {st.st_size} bytes, more than the {limit // MiB} MiB "
                                    "hpcrun reads from one file")
            data = f.read(limit + 1)
    except OSError as exc:
        raise TextFileError(exc.strerror or str(exc)) from None
    if len(data) > limit:
        raise TextFileError(f"it holds more than the {limit // MiB} MiB hpcrun reads from one file")
    nul = data.find(b"\0")
    if nul >= 0:
        raise TextFileError("it contains a NUL byte: this is a binary file, not text",
                            data.count(b"\n", 0, nul) + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TextFileError("it is not UTF-8 text (the first bad byte is on this line)",
                            data.count(b"\n", 0, exc.start) + 1) from None
