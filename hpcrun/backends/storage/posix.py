"""A directory on another filesystem as an export destination (``outputs.export: /PATH``).

Not a URL scheme: inputs are plain paths already. The copy lands under a temporary name, is
flushed to the disk and renamed, as the XRootD destination does, so a reader never sees half a
file under its final name.
"""

from __future__ import annotations

import os
import shutil
from typing import Dict, Sequence

from hpcrun.backends.storage.base import Described, Sender, TransferError, file_checksum


class Directory:
    """The same two calls as a Storage's: put and stored."""

    def put(self, local: str, dest: str, sender: Sender) -> None:
        part = f"{dest}.hpcrun-part"
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(local, "rb") as src, open(part, "wb") as out:
                shutil.copyfileobj(src, out, 8 * 1024 * 1024)
                out.flush()
                os.fsync(out.fileno())
            os.replace(part, dest)
        except OSError as exc:
            raise TransferError(f"copying to {dest} failed: {exc.strerror or exc}") from None

    def stored(self, dests: Sequence[str], sender: Sender) -> Dict[str, Described]:
        out: Dict[str, Described] = {}
        for dest in dests:
            try:
                out[dest] = Described(size=os.stat(dest).st_size, checksum=file_checksum(dest))
            except FileNotFoundError:
                out[dest] = Described(missing=True, error=f"{dest} does not exist")
            except OSError as exc:
                out[dest] = Described(error=f"{dest}: {exc.strerror or exc}")
        return out
