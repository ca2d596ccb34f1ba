"""Durable storage: the storage seam, the shared log, group commit, checkpoints and blobs.

See docs/storage.md for the format and the durability rules.
"""
