"""`fermium convert`: Hugging Face safetensors checkpoints to llama.cpp-compatible GGUF."""
from .errors import ConvertError
from .quantize import FILE_TYPES
from .writer import ConvertResult, convert

__all__ = ["ConvertError", "ConvertResult", "FILE_TYPES", "convert"]
