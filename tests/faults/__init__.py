"""The fault catalogue of issue 13: each fault reproduced against real components, and what must hold."""
