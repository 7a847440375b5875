"""ablate: declarative ablation sweeps for small language-model architectures, with a results database."""

__version__ = "0.1.0"
