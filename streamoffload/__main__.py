"""``python -m streamoffload`` and ``spark-submit .../streamoffload/__main__.py``."""

import sys

from streamoffload.cli import main

if __name__ == "__main__":
    sys.exit(main())
