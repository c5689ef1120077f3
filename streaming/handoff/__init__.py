"""What one stage hands another outside Spark's rows: the block layouts of a part (segmenter -> sink) and the
spool of entries a source task read (source -> sink)."""
