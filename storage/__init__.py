"""Object stores (filesystem, S3) behind one small interface, object keys, and the offloaded read
handle that reads entries back by position."""
