"""The vision tower of Qwen3.5/3.6, read from llama.cpp's mmproj GGUF: its config (config.py), its
tensors by role (tensors.py) and the image preprocessing (preprocess.py). The numpy reference
encoder is common/reference/vision.py."""
