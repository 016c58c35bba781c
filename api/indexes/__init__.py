"""``GET /v1/indexes``: what the registry in Redis holds, nothing loaded."""
