"""The offloaded history as Apache Iceberg tables: where they are (``catalog``), what a topic's table is
(``layout``), how far it has taken its topic (``position``), appending what the store committed past it exactly
once (``sync``), where it stands against the store (``status``), and keeping it small and in step with the store:
retention, compaction, snapshot expiry and orphan removal (``maintenance``)."""
