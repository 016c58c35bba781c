"""``POST /v1/query`` and its stream: the router, the request and response bodies, the renderers."""
