"""Object storage for datakit: sources, shard roots and outputs named by fsspec URLs.

- `urls`: which paths are remote, the fsspec filesystem of a URL, Hub repo ids (`lerobot/pusht`).
- `retry`: retries with exponential backoff on transient errors, then one clear error.
- `transfer`: fetch source files to a local scratch folder; upload finished shards, then the
  index, then `checksums.json` last.
- `cache`: a node-local shard cache for remote shard roots (size limit, LRU, shared by ranks);
  `cache_disk`: its bytes on disk and eviction; `download_ahead`: its thread that fetches shards
  in the sampler's order ahead of the reader.
- `roots`: open a shard root, local or remote (through the cache).
"""
