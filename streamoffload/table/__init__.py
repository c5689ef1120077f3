"""The offloaded history as Apache Iceberg tables."""
