"""Object stores behind one small interface (``base``): the filesystem store (``filesystem``, made durable by
``fs_sync``, read by range through ``local_files``) and S3 (``s3``, ``s3_runtime``, ``s3_errors``); where a store
is (``location``) and every object key in it (``keys``); the start-up check of what a store does (``probe``) and
the benches' request counts (``request_counts``). Reading entries back by position is ``read/segment/``."""
