"""`specdec bench` as a script: python client/bench.py --help (the logic is in specdec.client)."""

import sys

from specdec.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
