"""L3: where batches run (never what they are): torch's worker set-up, process and thread workers, the pool."""
