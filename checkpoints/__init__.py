"""The offload metadata, kept in the same store as the data and always written last: segment manifests
(``manifest``; stored and read by ``metadata_store``, followed incrementally by ``metadata_view``), the writer
lease (``lease``), the offload policy (``policy``), encryption keys (``keyring``), ``offload-now``'s requests
(``control_requests``), retention and its deleted-segment records (``retention``, ``deleted_segments``), what
``cleanup`` may delete beside a writer (``cleanup_guard``) and Pulsar's own offloaded ledgers adopted into the
store (``pulsar_adopt``)."""
