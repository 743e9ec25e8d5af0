"""`specdec check` as a script: python client/check.py --help (the logic is in specdec.client)."""

import sys

from specdec.cli import main

if __name__ == "__main__":
    sys.exit(main(["check", *sys.argv[1:]]))
