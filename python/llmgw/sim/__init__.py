"""Engine simulator (vLLM stand-in, no GPU); must not import llmgw._core, gateway or cli."""
