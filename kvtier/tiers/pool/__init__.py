"""The memory tiers (`medium = "gpu"` and `"cpu"`): a tier's blocks in one preallocated torch
tensor. `kind.py` is their config tables and declarations (imported when a config is
validated, so it imports no torch), `storage.py` their `TorchPool` and openers."""
