"""Benchmark tasks. Each is a small versioned module plus ``conf/task/<name>.yaml`` (Hydra ``_target_``).

A task yields :class:`tasks.types.Sample` items, renders them into prompt text for a tokenizer (chat
template for instruct models, plain text for base models), post-processes completions for scoring, and
scores them (pass@1, accuracy, ROUGE) -- code execution only when explicitly allowed.
"""
