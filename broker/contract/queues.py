"""Queue and task names: the API enqueues by name and never imports the workers."""

from __future__ import annotations

RETRIEVAL_QUEUE = "retrieval"
GENERATION_QUEUE = "generation"
CALLBACKS_QUEUE = "callbacks"
# Documents uploaded over HTTP become new index versions here, on a worker of its own (`ragline
# worker ingest`): an ingest takes seconds to minutes, and queries keep their retrieval workers.
INGEST_QUEUE = "ingest"
# The queues a query needs; readiness requires a live worker on each. Webhook delivery
# (CALLBACKS_QUEUE) can lag without failing any request, so it is not among them.
QUEUES = (RETRIEVAL_QUEUE, GENERATION_QUEUE)

RETRIEVE_TASK = "ragline.retrieve"
GENERATE_TASK = "ragline.generate"
DELIVER_WEBHOOK_TASK = "ragline.deliver_webhook"
# A job run as it was sent (a task queued by an earlier release); the API now sends turns.
INGEST_TASK = "ragline.ingest"
# One turn on the ingest queue: the next API key's oldest job (broker/state/ingest_turns.py).
INGEST_TURN_TASK = "ragline.ingest_turn"
# One shard's part of a sharded search, on that shard's queue (broker/state/shards.py: shard_queue).
SEARCH_SHARD_TASK = "ragline.search_shard"
