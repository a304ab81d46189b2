"""TensorRT-LLM's LLM API over the one engine (`cast_trtllm.llmapi` is its public face)."""
