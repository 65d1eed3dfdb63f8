"""L4: bridges to torch's own APIs (``IterableDataset``) and helpers for distributed training."""
