"""The OpenAI-compatible HTTP client of adaptcheck: requests, streaming timings, server quirks, one
error type and one answer record for every server (docs/endpoints.md, "The OpenAI client").
"""
