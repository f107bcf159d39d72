"""Checksum values as a spec writes them: ``<algo>:<hex>`` (``adler32:0a1b2c3d``, ``md5:<32 hex>``)."""

from __future__ import annotations

import re
from typing import Optional

HEX_DIGITS = {"adler32": 8, "md5": 32}
_VALUE = re.compile(r"^([a-z0-9]+):([0-9A-Fa-f]+)$")


def syntax_error(value: str) -> Optional[str]:
    """Why ``value`` is not a checksum value, or None when it is one."""
    m = _VALUE.match(value)
    algo = m.group(1) if m else value.partition(":")[0]
    if algo not in HEX_DIGITS:
        return (f"'{value}' is not a checksum; write adler32:<8 hex digits> (e.g. "
                "adler32:0a1b2c3d) or md5:<32 hex digits>")
    digits = HEX_DIGITS[algo]
    if not m or len(m.group(2)) != digits:
        return f"'{value}' is not an {algo} checksum; write {algo}:<{digits} hex digits>"
    return None
