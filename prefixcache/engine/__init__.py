"""Request state, the scheduler, the engine loop and the offline ``LLM`` API."""
