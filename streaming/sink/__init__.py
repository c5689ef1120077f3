"""The sink: turns the segmenter's actions into uploads, fetching each part's entries from the spool or the broker
(``entry_fetch``)."""
