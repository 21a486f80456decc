"""A minimal but complete LLM serving engine: API server + ZMQ worker + paged KV cache."""
