"""The Ollama dialect: pure translation and validation."""
