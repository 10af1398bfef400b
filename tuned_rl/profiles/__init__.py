"""Profiles: TOML files with includes, and the declarations their tables are checked against."""
