"""reprobisect: find where two ML training runs first stop agreeing, and why.

The import package is ``reprobisect`` (the standard library already owns ``bisect``);
the command-line program is ``bisect``. The core imports no ML framework.
"""

__version__ = "0.1.0"

from reprobisect.errors import ReproError

__all__ = ["ReproError", "__version__"]
