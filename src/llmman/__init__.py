"""llmman: a local-LLM manager.

One daemon per machine keeps models in an OCI image-layout store, starts one llama.cpp
``llama-server`` child per loaded model on demand, and speaks the Ollama and OpenAI APIs.
"""

__version__ = "0.1.0"
