"""L3: the sources a pipeline reads, found by the one walk of a pipeline."""
