"""The prefill backends, each a common.engine_types.PrefillBackend: `cpu` (cpu.py) and `cuda`
(cuda.py), named, checked for availability and constructed by common/engines.py."""
