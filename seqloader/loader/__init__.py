"""L3: ``seqloader.DataLoader``, its resume state and its epoch orders."""
