"""GGML's weight types in numpy: their value tables and, per type, the reference dequantization."""
