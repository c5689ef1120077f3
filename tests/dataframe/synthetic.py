"""A synthetic offloaded store without a broker or Spark: bench/synthetic.py (bench/dataframe.py builds its
stores with it too), re-exported here."""

from __future__ import annotations

from bench.synthetic import CountingStore, Sent, build_topic

__all__ = ["CountingStore", "Sent", "build_topic"]
