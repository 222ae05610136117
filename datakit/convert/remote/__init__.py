"""A conversion whose SRC or OUT is on object storage (an fsspec URL, or for SRC a Hub repo id),
staged through local folders: run.py (convert_remote: stage, convert with the local
orchestrator, publish), source.py (fetch a remote SRC into a scratch folder), publish.py
(upload a finished conversion in commit order, shards streamed while it runs)."""
