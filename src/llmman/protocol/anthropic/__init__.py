"""The Anthropic Messages dialect: pure translation and validation."""
