#!/usr/bin/env python3
# hpcrun 0.1.0: checksum of one input of campaign star-reco-2019-apptainer, for the job's
# stage-in integrity check. Python 3, standard library only; runs on the host with the site profile's
# tools.python. Usage: hpcrun-checksum.py adler32|md5 FILE [FILE...]
# Prints, per file, 8 (adler32, as xrdadler32 does) or 32 (md5) lowercase hex digits, two spaces and the
# file's path (as md5sum does); a file that cannot be read is named on standard error (exit 1).
import hashlib
import sys
import zlib

CHUNK = 8 * 1024 * 1024


def checksum(algo, path):
    with open(path, "rb") as f:
        if algo == "adler32":
            value = 1
            for chunk in iter(lambda: f.read(CHUNK), b""):
                value = zlib.adler32(chunk, value)
            return format(value & 0xFFFFFFFF, "08x")
        try:
            digest = hashlib.md5(usedforsecurity=False)
        except TypeError:  # Python before 3.9
            digest = hashlib.md5()
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
        return digest.hexdigest()


def main(argv):
    if len(argv) < 3 or argv[1] not in ("adler32", "md5"):
        sys.stderr.write("usage: hpcrun-checksum.py adler32|md5 FILE [FILE...]\n")
        return 2
    rc = 0
    for path in argv[2:]:
        try:
            print(f"{checksum(argv[1], path)}  {path}")
        except OSError as exc:
            sys.stderr.write(f"cannot read {path}: {exc.strerror or exc}\n")
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
