"""The wire format: every task payload and stream event (messages), and the queue and task names."""
