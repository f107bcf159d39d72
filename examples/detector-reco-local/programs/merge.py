#!/usr/bin/env python3
"""Merge chain parts into one output, ordered by event id."""
import sys

import h5py
import numpy as np


def main() -> int:
    output, parts = sys.argv[1], sys.argv[2:]
    ids, energy = [], []
    for part in parts:
        with h5py.File(part, "r") as f:
            ids.append(f["event_id"][:])
            energy.append(f["energy"][:])
    all_ids = np.concatenate(ids)
    order = np.argsort(all_ids)
    with h5py.File(output, "w") as out:
        out["event_id"] = all_ids[order]
        out["energy"] = np.concatenate(energy)[order]
    print(f"merged {len(parts)} parts, {len(all_ids)} events -> {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
