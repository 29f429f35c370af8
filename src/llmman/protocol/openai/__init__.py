"""The OpenAI dialects (chat and text completions, Responses): pure checks and shapes."""
