"""OpenAI's chat API on the query pipeline: ``/v1/chat/completions`` and ``/v1/models``."""
