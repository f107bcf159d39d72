"""``python -m hpcrun``: the command line."""

from hpcrun.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
