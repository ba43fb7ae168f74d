"""The engines a replica runs, how each is launched and probed (vLLM, SGLang, llama.cpp, the
simulator), and llmgw's own two (`llamacpp/`, `sim/`); imports nothing from admin/, agent/,
control/, gateway/ or store/."""
