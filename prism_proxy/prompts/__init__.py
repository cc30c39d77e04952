"""From a request to what QAS queues and what the engine receives: segments, turns, token ids."""
