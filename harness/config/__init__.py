"""Settings: the schemas every conf/ YAML is checked against, composing conf/, and the torch-free precheck."""
