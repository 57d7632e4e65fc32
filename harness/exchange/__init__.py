"""Exchange formats: our rows as other benchmarks' files and theirs as ours (Spec-Bench answer files)."""
