"""L3: the loader's resume state: the one dict, built, checked and migrated only here, and ``Progress``."""
