"""Scheduling: which models are loaded, admission, eviction, healing, memory and accelerators."""
