"""Developer tools that are not part of the installed package (run them from a checkout)."""
