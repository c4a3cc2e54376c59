"""torch.nn: Parameter is set by the package."""
