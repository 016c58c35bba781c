"""What a request may take: token buckets, per-key leases, queue backpressure, the SSRF guard."""
