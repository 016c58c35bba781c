"""Async jobs: ``POST/GET/DELETE /v1/jobs`` (router), their bodies (protocol), the job service."""
