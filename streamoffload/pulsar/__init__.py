"""The Pulsar binary-protocol client: frames, a broker connection, the raw-entry reader, the
``pulsar-client`` reader, the exactly-once range loop and the latest-position lookups. No Spark: every module
here runs in a plain Python process."""
