"""State kept in Redis: jobs, webhooks, API keys, the index registry, shards, document lists,
the result cache and worker heartbeats. Each Lua script sits beside the module that calls it.
"""
