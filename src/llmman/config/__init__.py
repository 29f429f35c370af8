"""Configuration: the settings table, layered settings with origins, presets.

The only reader of ``os.environ``."""
