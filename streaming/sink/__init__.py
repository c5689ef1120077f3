"""The sink: turns the segmenter's actions into uploads (``sink``), fetching each part's entries from the spool or
the broker (``entry_fetch``), storing its blocks as the policy says (``at_rest``) and committing each segment in
its crash-safe order (``commit``)."""
