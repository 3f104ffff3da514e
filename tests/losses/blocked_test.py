"""The CPU row-blocked divergence (several [rows, V] blocks in a lax.map) gives
the float64 reference values and closed-form gradients, like one block."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdistill import losses
from tests.losses import reference as ref

# The module (jaxdistill.losses exports a function of the same name).
div_lib = importlib.import_module("jaxdistill.losses.divergence")

B, T, V = 2, 6, 7


@pytest.fixture
def blocked(monkeypatch):
  # 2 rows of [V] float32 per block: 6 blocks of the 12 rows.
  monkeypatch.setattr(div_lib, "_CPU_UNBLOCKED_BYTES", 0)
  monkeypatch.setattr(div_lib, "_CPU_BLOCK_BYTES", 2 * 4 * V)


@pytest.mark.parametrize("kind,beta", [("forward", 0.5), ("reverse", 0.5),
                                       ("jsd", 0.3)])
def test_blocked_matches_reference(blocked, kind, beta):
  del blocked
  assert div_lib._row_block(B * T, V) == 2  # pylint: disable=protected-access
  rng = np.random.default_rng(0)
  z = (2 * rng.standard_normal((B, T, V))).astype(np.float32)
  u = (2 * rng.standard_normal((B, T, V))).astype(np.float32)
  mask = rng.random((B, T)) < 0.7
  mask[0, 0] = True
  z[1, -1] = np.nan  # garbage at a masked position stays out
  mask[1, -1] = False
  f = jax.jit(jax.value_and_grad(
      lambda z: losses.divergence(z, u, mask, kind=kind, beta=beta,
                                  temperature=0.8, reduction="sequence_mean"),
      has_aux=True))
  (loss, metrics), g = f(jnp.asarray(z))
  zc = np.where(mask[..., None], z, 0.0)
  d = ref.divergences(zc, u, 0.8, beta)
  w = ref.weights(mask, "sequence_mean")
  np.testing.assert_allclose(loss, np.sum(w * np.where(mask, d[kind], 0.0)),
                             rtol=2e-6)
  n = mask.sum()
  np.testing.assert_allclose(metrics["distill/fkl"],
                             np.sum(np.where(mask, d["forward"], 0.0)) / n,
                             rtol=2e-6)
  assert np.all(np.isfinite(g)) and np.all(g[~mask] == 0.0)
  if kind != "jsd":
    want = ref.grad_closed_form(zc, u, mask, kind, "sequence_mean", 0.8)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=2e-7)
