"""``python -m reprobisect.native``: build the fingerprint kernel for this machine now (setup
scripts and images call it, so the first recorded run does not pay the compile)."""

from __future__ import annotations

import sys

from reprobisect import native


def main() -> int:
    try:
        path = native.build(verbose="-v" in sys.argv[1:])
    except RuntimeError as e:
        print(f"reprobisect: {e}; recording still works through framework ops, only slower", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
