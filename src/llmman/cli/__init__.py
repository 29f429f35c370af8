"""The ``llmman`` command line: a client of the daemon's HTTP API, plus direct store access.

``main.py`` routes verbs (argparse) to handlers in ``commands_*.py``; ``client.py`` speaks the daemon's
Ollama routes; ``autostart.py`` starts a daemon for ``run``; ``tables.py`` holds the pure formatters;
``repl.py`` is the interactive chat. Nothing here is imported by the rest of the package.
"""
