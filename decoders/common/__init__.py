"""Pieces shared by every decoder: the one forward helper, KV-cache edits, stop rule, verification."""
