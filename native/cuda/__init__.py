"""The CUDA prefill runner: kernel loading, the streaming plan, weights and layers."""
