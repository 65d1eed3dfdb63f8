"""L3: the epoch orders a loader computes (seekable samplers) or reads (a user's own sampler)."""
