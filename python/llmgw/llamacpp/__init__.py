"""`llmgw engine llamacpp`: a GGUF model on the CPU (llama-cpp-python) behind the OpenAI surface the gateway needs."""
