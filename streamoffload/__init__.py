"""streamoffload: continuous PIP-76 streaming offload of Apache Pulsar topics, on Spark."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("streamoffload")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
