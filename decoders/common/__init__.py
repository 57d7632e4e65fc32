"""Pieces shared by every decoder: the one forward helper, KV-cache edits, stop rule, verification,
token-tree layouts and the n-gram pool / prompt-lookup matcher."""
