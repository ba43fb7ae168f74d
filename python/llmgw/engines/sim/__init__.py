"""Engine simulator (vLLM stand-in, no GPU); imports nothing from gateway/ or cli/, and
llmgw._core only inside functions (for a tokenizer its config names)."""
