"""The web page at ``/``: static files, no build step, nothing from elsewhere."""
