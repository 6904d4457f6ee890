"""What torchrun starts in tests/test_distributed.py: the launcher recording this rank.

TODO(issue 13 merge): helper boot's launcher records torchrun itself; until then this
wrapper writes TRACE/ranks/rank-<RANK>/ (a flat TRACE when WORLD_SIZE is 1).
"""
import os
import sys

from reprobisect.runners import launch

trace = os.environ["RB_TRACE"]
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    trace = os.path.join(trace, "ranks", f"rank-{os.environ['RANK']}")
launch.main(["--trace", trace, "--steps", os.environ.get("RB_STEPS", "3"), "--", *sys.argv[1:]])
