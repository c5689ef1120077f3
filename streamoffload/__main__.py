"""``python -m streamoffload`` and ``spark-submit .../streamoffload/__main__.py``."""

from streamoffload.cli import entry

if __name__ == "__main__":
    entry()
