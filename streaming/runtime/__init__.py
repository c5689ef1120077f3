"""How Spark's Python processes start and live: the worker launcher and daemon, the fork server, the garbage
collector freeze, the side files the driver hands its workers, and the crash points of the fault tests."""
