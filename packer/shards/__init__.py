"""Shards: the schema (the contract), assembling packs, and atomic I/O."""
