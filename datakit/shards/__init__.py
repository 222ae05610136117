"""Shard side of the contract: tar writer, global index, statistics."""
