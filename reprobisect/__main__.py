import sys

from reprobisect.cli import main

sys.exit(main())
