"""The offloaded history as Apache Iceberg tables: where they are (``catalog``), what a topic's table is
(``layout``), how far it has taken its topic (``position``), appending what the store committed past it exactly
once (``sync``) and where it stands against the store (``status``)."""
