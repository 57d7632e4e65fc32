"""Decoders: vanilla greedy, draft-model speculative decoding, transformers' assisted generation,
lookahead decoding, prompt lookup decoding, Ouroboros and OPT-Tree.

Each decoder is a class registered in one line at the end of ``decoders/settings.py`` (its config name, class
path and declared settings; Hydra's schema is generated from it) and built by Hydra from
``conf/decoder/<name>.yaml`` (``_target_`` + ``_partial_`` from the schema); the runner supplies
``target_model``, ``draft_model`` and ``eos_token_ids``.
"""
