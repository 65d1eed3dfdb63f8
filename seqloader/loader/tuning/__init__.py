"""L3: where the time goes and which configuration fits: ``stats()``, its hint, and autotune's policy (its tuned iterator is the epoch's: :mod:`seqloader.loader.epoch.tuned`)."""
