"""Where the bundled demo model lives: models/ at the repository root (an editable install)."""
from __future__ import annotations

from pathlib import Path

DEMO_MODEL_NAME = "shakespeare-demo-q8_0.gguf"
MODELS_DIR = Path(__file__).resolve().parents[2] / "models"


def default_model_path() -> Path:
    """The bundled demo GGUF (q8_0), used when no --model is given."""
    path = MODELS_DIR / DEMO_MODEL_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"the bundled demo model {path} is missing. It ships in the repository's models/ folder, "
            "so run Fermium from a checkout (pip install -e .), or pass --model PATH to a GGUF file.")
    return path
