"""`jaxdistill.evaluate` with --checkpoint / --baseline / --out on gs://,
against the emulator (tests/gcs_emulator.py): the result read back from the
bucket equals the result of the same evaluation from local directories."""
import json

import pytest

from jaxdistill import storage
from jaxdistill.evaluate import run as evaluate_run
from tests import gcs_emulator
from tests.evaluate.evaluate_test import perturbed  # pylint: disable=unused-import  # a fixture
from tests.evaluate.evaluate_test import stub_config
from tests.evaluate.evaluate_test import stub_factory
from tests.gcs_emulator import gcs  # pylint: disable=unused-import  # a fixture

GS = f"gs://{gcs_emulator.BUCKET}/eval"


def test_evaluate_reads_and_writes_gs(gcs, tiny_ckpt, perturbed, tmp_path):
  del gcs
  # The checkpoint as a training workdir on gs:// (its hf_student/ export).
  storage.upload_dir(str(tiny_ckpt), f"{GS}/run/hf_student", last="config.json")
  storage.upload_dir(str(perturbed), f"{GS}/base", last="config.json")
  factory = stub_factory({"checkpoint": lambda p: p == 0,
                          "baseline": lambda p: True})
  want = evaluate_run.run(stub_config(tmp_path), str(tiny_ckpt), str(perturbed),
                          generator_factory=factory)
  got = evaluate_run.run(stub_config(tmp_path), f"{GS}/run", f"{GS}/base",
                         f"{GS}/out/r.json", generator_factory=factory)
  assert got["metrics"] == want["metrics"]  # sparsity from the downloads too
  assert "sparsity/S_1e-6_f32" in got["metrics"]
  assert json.loads(storage.read_text(f"{GS}/out/r.json"))["metrics"] == want["metrics"]


def test_unfinished_gs_upload_is_refused(gcs, tiny_ckpt, tmp_path, monkeypatch):
  del gcs
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match=r"--checkpoint: gs:/b/x is not a gs:// URL"):
    evaluate_run.run(stub_config(tmp_path), "gs:/b/x")
  assert not (tmp_path / "gs:").exists()  # never made locally
  storage.write_text(f"{GS}/half/model.safetensors", "x")  # no config.json
  with pytest.raises(FileNotFoundError, match=r"--checkpoint: .*holds no config.json"):
    evaluate_run.run(stub_config(tmp_path), f"{GS}/half")
  with pytest.raises(ValueError, match=r"--out: .*s3://"):
    evaluate_run.run(stub_config(tmp_path), str(tiny_ckpt), out="s3://b/r.json")
