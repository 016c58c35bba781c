"""Talking to Redis: clients and pools, key names, Lua scripts (one loader), the Celery transport fix,
raw task pushes and the memory guard.
"""
