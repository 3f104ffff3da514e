"""A local Google Cloud Storage for tests: gcp-storage-emulator (the test
extra) serving on 127.0.0.1, in memory, in a process of its own so that the
training subprocesses a test kills and restarts all see the same bucket.

Run as a script it serves one, with two fixes where the emulator
(2026.7.19) differs from GCS:
- GCS answers a media download with the object's generation in an
  x-goog-generation header, which tensorstore needs to read an object back
  (without it: "Malformed StorageGeneration", and Orbax's later saves
  fail); the emulator leaves it out, `_serve` adds it;
- GCS refuses an upload with ifGenerationMatch=0 (create only) when the
  object exists (412), which the workdir lock relies on; the emulator
  overwrites, `_serve` refuses.

`env(url)` points every client at it and away from anything else: gcsfs and
google-cloud-storage read STORAGE_EMULATOR_HOST, tensorstore (Orbax's
checkpoints) TENSORSTORE_GCS_HTTP_URL; the metadata-server variables name a
closed local port, so no client asks the network for credentials.
"""
import contextlib
import http
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

BUCKET = "jd-test"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def env(url: str) -> dict:
  closed = f"127.0.0.1:{_free_port()}"
  return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
          "GCE_METADATA_HOST": closed, "GCE_METADATA_IP": closed,
          "GCE_METADATA_ROOT": closed, "NO_GCE_CHECK": "true",
          # gcsfs would otherwise ask the storage control API (not emulated)
          # for the bucket type of each path.
          "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
          "GOOGLE_CLOUD_PROJECT": "test"}


@contextlib.contextmanager
def running(log_path):
  """Serves a fresh in-memory store with BUCKET; yields its URL."""
  pytest.importorskip(
      "gcp_storage_emulator",
      reason="gcp-storage-emulator (pip install -e .[test]) runs the gs:// tests")
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  with open(log_path, "w") as log:
    proc = subprocess.Popen([sys.executable, __file__, str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 30
    while True:
      try:
        urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}", timeout=1)
        break
      except OSError:
        if proc.poll() is not None or time.time() > deadline:
          raise RuntimeError(f"the GCS emulator did not start (see {log_path})")
        time.sleep(0.1)
    yield url
  finally:
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """The emulator's URL, with this process's clients pointed at it (tests
  import this fixture by name)."""
  log = tmp_path_factory.mktemp("gcs") / "emulator.log"
  with running(log) as url:
    saved = dict(os.environ)
    os.environ.update(env(url))
    import gcsfs  # pylint: disable=g-import-not-at-top
    gcsfs.GCSFileSystem.clear_instance_cache()  # made for another endpoint
    try:
      yield url
    finally:
      os.environ.clear()
      os.environ.update(saved)
      gcsfs.GCSFileSystem.clear_instance_cache()


def _serve(port: int):
  from gcp_storage_emulator.handlers import objects  # pylint: disable=g-import-not-at-top
  download = objects.download

  def with_generation(request, response, storage, *args, **kwargs):
    try:
      obj = storage.get_file_obj(request.params["bucket_name"],
                                 request.params["object_id"])
      response["x-goog-generation"] = str(obj["generation"])
      response["x-goog-metageneration"] = str(obj["metageneration"])
    except Exception:  # pylint: disable=broad-except
      pass  # not found: the handler answers 404
    return download(request, response, storage, *args, **kwargs)

  insert = objects.insert

  def create_only(request, response, storage, *args, **kwargs):
    kind = (request.query.get("uploadType") or [""])[0]
    if (request.query.get("ifGenerationMatch") == ["0"] and
        kind in ("media", "multipart")):
      name = (request.query.get("name") or [None])[0]
      if name is None and kind == "multipart":
        name = request.data["meta"].get("name")
      try:
        storage.get_file_obj(request.params["bucket_name"], name)
        response.status = http.HTTPStatus.PRECONDITION_FAILED
        response.json({"error": {"code": 412, "message": "conditionNotMet"}})
        return None
      except Exception:  # pylint: disable=broad-except
        pass  # absent: created below
    return insert(request, response, storage, *args, **kwargs)

  objects.download = with_generation  # before the server's routes take them
  objects.insert = create_only
  from gcp_storage_emulator import server  # pylint: disable=g-import-not-at-top
  srv = server.create_server("127.0.0.1", port, in_memory=True,
                             default_bucket=BUCKET)
  srv.start()
  while True:
    time.sleep(3600)


if __name__ == "__main__":
  _serve(int(sys.argv[1]))
