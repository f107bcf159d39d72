#!/usr/bin/env python3
"""Print the number of events in a raw or reconstructed file (for the QA rule)."""
import sys

import h5py

with h5py.File(sys.argv[1], "r") as f:
    print(len(f["event_id"]))
