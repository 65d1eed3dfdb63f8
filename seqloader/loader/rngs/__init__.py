"""L3: the only code that seeds, saves, restores or watches the global generators."""
