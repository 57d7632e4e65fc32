"""Decoders: vanilla greedy, draft-model speculative decoding, transformers' assisted generation,
lookahead decoding and prompt lookup decoding.

Each decoder is a class built by Hydra (``conf/decoder/<name>.yaml``, ``_target_`` + ``_partial_``);
the runner supplies ``target_model``, ``draft_model`` and ``eos_token_ids``.
"""
