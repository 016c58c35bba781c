"""The thin async API: admits requests, enqueues work, relays events. Never imports workers."""
