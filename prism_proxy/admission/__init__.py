"""Admission: the sans-IO core (queue, rounds, waves, pacing) and its asyncio driver."""
