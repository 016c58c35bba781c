"""Queue and task names: the API enqueues by name and never imports the workers."""

from __future__ import annotations

RETRIEVAL_QUEUE = "retrieval"
GENERATION_QUEUE = "generation"
CALLBACKS_QUEUE = "callbacks"
# The queues a query needs; readiness requires a live worker on each. Webhook delivery
# (CALLBACKS_QUEUE) can lag without failing any request, so it is not among them.
QUEUES = (RETRIEVAL_QUEUE, GENERATION_QUEUE)

RETRIEVE_TASK = "ragline.retrieve"
GENERATE_TASK = "ragline.generate"
DELIVER_WEBHOOK_TASK = "ragline.deliver_webhook"
