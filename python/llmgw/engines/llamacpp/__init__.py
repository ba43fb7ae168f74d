"""`llmgw engine llamacpp`: a GGUF model on the CPU (llama-cpp-python) behind the OpenAI surface the gateway needs."""

INSTALL = ('CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
           "pip install 'llmgw[cpu]'")
"""The command that installs llama.cpp for llmgw. pip compiles llama-cpp-python from source,
by default for the building CPU's every instruction set; some VMs advertise one (AMX) that a
process then faults on at its first inference. These flags build for any x86-64 CPU with AVX2.
This is for an install outside a clone (a clone has `make up`); docs/troubleshooting.md gives
the same command."""
