"""Test-wide setup: simulate 8 CPU devices so sharding tests can build meshes,
and share compiled programs between tests through JAX's persistent cache
(many tests compile the same tiny models; this changes no result)."""
import os

# Must happen before JAX initialises its backends; subprocesses inherit these.
# XLA_FLAGS is often set already (GPU machines): add the device count to it.
_DEVICES = "--xla_force_host_platform_device_count"
if _DEVICES not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      f for f in (os.environ.get("XLA_FLAGS", ""), f"{_DEVICES}=8") if f)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser(
    "~/.cache/jaxdistill/jax-compile-cache-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
