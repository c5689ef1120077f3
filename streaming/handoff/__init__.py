"""What one stage hands another: the segmenter's actions for the sink (``actions``) and the positions rows the
source gives the segmenter (``positions``), one entry's metadata (``entry``), the block layouts of a part
(segmenter -> sink) and the spool of entries a source task read (source -> sink)."""
