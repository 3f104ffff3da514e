"""bench.fit's tables: every experiment of issue 40 item 5 is compiled by
`python -m jaxdistill.bench.fit` with the pair the config itself names, on a
slice of the study. Cheap checks only: nothing is compiled."""
import os

import pytest

from jaxdistill import config_lib
from jaxdistill import models
from jaxdistill.bench import fit

# Issue 40 item 5, with each config's model pairs (student, teacher) as the
# paper gives them: the main grid on Llama and its Qwen replication, the
# Countdown-3 LR sweep, the spectrum (Sec. 5.2, App. A.5), no clipping,
# sampled KL, Numina-MATH (App. A.3), the Spanish style transfer (App. D.7)
# and the teacher-temperature ablation.
LLAMA = ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")
QWEN = ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct")
ITEM5 = {
    "grid_main": (LLAMA, QWEN),
    "grid_lr_sweep": (LLAMA,),
    "grid_spectrum": (LLAMA, QWEN),
    "grid_noclip": (LLAMA,),
    "grid_sampled_kl": (LLAMA,),
    "grid_math": (("Qwen/Qwen2.5-1.5B-Instruct",
                   "Qwen/Qwen2.5-Math-1.5B-Instruct"),),
    "grid_spanish": (("Qwen/Qwen2.5-1.5B-Instruct",
                      "Qwen/Qwen2.5-3B-Instruct"),),
    "grid_temperature": (LLAMA,),
}


def _names_preset(hub: str, preset: str) -> bool:
  """'Qwen/Qwen2.5-Math-1.5B-Instruct' names preset 'qwen2.5-math-1.5b'."""
  return hub.split("/")[-1].lower().removesuffix("-instruct") == preset


def _config_pairs(name: str, family: str) -> set:
  """The (student, teacher) hub names the config's arms run with `family`:
  its family axis's presets, else its base run's paths."""
  c = config_lib.load_config(fit.CONFIGS[name][1].format(family=family))
  fams = [a[2] for a in c.axes if a[0] == "family"]
  if fams:
    return {(c.presets.family[f].student.path, c.presets.family[f].teacher.path)
            for f in fams[0]}
  return {(c.base.student.path, c.base.teacher.path)}


@pytest.mark.parametrize("name", sorted(ITEM5))
def test_item5_config_in_fit_with_its_pair(name):
  assert name in fit.CONFIGS, f"bench.fit.CONFIGS lacks {name}"
  kind, spec, families = fit.CONFIGS[name]
  assert kind == "sweep"
  assert os.path.exists(spec.partition(":")[0])
  compiled = set()
  for family in families:
    student, teacher, vocab = fit.FAMILIES[family]
    assert student in models.PRESETS and teacher in models.PRESETS
    assert fit.STUDY[family] in fit.SLICES
    assert vocab > 0
    pairs = _config_pairs(name, family)
    # The presets compiled are the shapes of the config's own checkpoints.
    assert len(pairs) == 1, pairs
    (hub_student, hub_teacher), = pairs
    assert _names_preset(hub_student, student), (family, hub_student)
    assert _names_preset(hub_teacher, teacher), (family, hub_teacher)
    compiled.add((hub_student, hub_teacher))
  # grid_main also compiles Qwen2.5-0.5B <- 7B, an extra pair of ours.
  assert set(ITEM5[name]) <= compiled, compiled


def test_names_preset():
  assert _names_preset("Qwen/Qwen2.5-Math-1.5B-Instruct", "qwen2.5-math-1.5b")
  assert not _names_preset("Qwen/Qwen2.5-Math-1.5B-Instruct", "qwen2.5-1.5b")
  assert _names_preset("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b")


def test_unknown_config_is_one_line_error():
  with pytest.raises(SystemExit, match="--configs: unknown 'grid_nope'"):
    fit.main(["--configs", "grid_nope"])
