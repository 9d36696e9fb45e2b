"""Materialize a plan (run directory) and start workers: locally via torch's elastic agent."""
