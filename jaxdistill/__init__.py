"""jaxdistill: a JAX/Flax codebase for studying strong-to-weak LLM distillation."""

__version__ = "0.1.0"
