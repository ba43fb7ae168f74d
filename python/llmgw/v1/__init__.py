"""Generated gRPC stubs of the llmgw.v1 API (agent service); make generate writes them."""
