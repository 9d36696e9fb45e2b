"""Checkpoint folders: layout, completeness and retention (torch-free)."""
