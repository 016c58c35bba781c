"""Queue and task names: the API enqueues by name and never imports the workers."""

from __future__ import annotations

RETRIEVAL_QUEUE = "retrieval"
GENERATION_QUEUE = "generation"
CALLBACKS_QUEUE = "callbacks"
QUEUES = (RETRIEVAL_QUEUE, GENERATION_QUEUE)

RETRIEVE_TASK = "ragline.retrieve"
GENERATE_TASK = "ragline.generate"
