"""Data: user-file converters (`sources`), TFDS builders (`builders`),
tokenizers (`tokenizer`) and random-access batch pipelines (`pipeline`).

Submodules are imported on demand: the builders pull in tensorflow_datasets
and the tokenizer pulls in transformers, which a caller that only converts
files should not pay for.
"""
