"""HTTP surface of the daemon: one route table (app.py), one module per dialect."""
