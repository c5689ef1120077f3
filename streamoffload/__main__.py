"""``python -m streamoffload`` and ``spark-submit .../streamoffload/__main__.py``."""

import os
import sys

# Run as a file (spark-submit's way), Python puts this file's directory first on sys.path, and the package's own
# subpackages would shadow top-level modules of the same name (``pulsar``: pulsar-client's; ``codecs``).
if sys.path and sys.path[0] and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

from streamoffload.cli import entry

if __name__ == "__main__":
    entry()
