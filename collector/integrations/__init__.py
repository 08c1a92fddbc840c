"""The measured knee handed to the tools that act on it: KEDA, the Gateway API Inference Extension, llm-d."""
