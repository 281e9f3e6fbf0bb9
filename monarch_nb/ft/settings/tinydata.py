"""A tiny tokenizer and corpus built on this machine, so training needs no hub download.

``ensure_tinydata()`` writes, once per cache directory, a deterministic English-like corpus
(generated from a seeded grammar) and a byte-level BPE tokenizer trained on it with HF
``tokenizers``, saved as ``tokenizer.json`` + ``tokenizer_config.json`` - the layout that
torchtitan's ``HuggingFaceTokenizer`` loads from a local path. The vocabulary fits the
Llama 3 debug model (2048 entries). Building takes about a second; later calls only check
the manifest. The corpus is also written where torchtitan's ``c4_test`` dataset expects its files
(:data:`TITAN_LAYOUT`), for torchtitan 0.3 jobs that name it. The cache lives under ``$MONARCH_NB_CACHE`` or ``~/.cache/monarch_nb``.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

VERSION = 2  # 2: the corpus also in the layout of torchtitan's c4_test (TITAN_LAYOUT)
VOCAB_SIZE = 2048
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
TITAN_LAYOUT = "c4_test/c4_sample.json"  # what torchtitan's c4_test loader reads: json lines with "text"
HELD_OUT = "validation/c4_sample.json"  # a held-out corpus (another seed) in the same layout, for validators

_SUBJECTS = ["the cat", "a dog", "the old fox", "my neighbour", "the small robot", "a farmer", "the teacher",
             "our captain", "the river", "a young bird", "the baker", "the quiet child", "every sailor"]
_VERBS = ["sees", "likes", "follows", "paints", "builds", "finds", "carries", "watches", "helps", "remembers",
          "counts", "visits", "answers"]
_OBJECTS = ["the red ball", "a wooden boat", "the bright moon", "seven apples", "the long road", "a green door",
            "the tall tree", "a warm loaf", "the blue kite", "an empty box", "the morning train", "a silver key"]
_PLACES = ["near the hill", "in the garden", "by the sea", "under the bridge", "at the market", "in the kitchen",
           "on the roof", "behind the barn", "across the field", "inside the library"]
_TIMES = ["every morning", "at night", "after lunch", "before the rain", "on sunday", "in winter", "today"]


def cache_root() -> Path:
    return Path(os.environ.get("MONARCH_NB_CACHE") or Path.home() / ".cache" / "monarch_nb")


def _sentence(rng: random.Random) -> str:
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    if rng.random() < 0.6:
        s += f" {rng.choice(_PLACES)}"
    if rng.random() < 0.4:
        s += f" {rng.choice(_TIMES)}"
    return s[0].upper() + s[1:] + "."


def make_corpus(n_docs: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(_sentence(rng) for _ in range(rng.randint(3, 8))) for _ in range(n_docs)]


def ensure_tinydata(root: str | Path | None = None) -> Path:
    """Build (once) and return the directory holding tokenizer.json, tokenizer_config.json, corpus.jsonl
    and the corpus in c4_test's layout."""
    base = Path(root) if root is not None else cache_root()
    out = base / f"tinydata-v{VERSION}"
    if (out / "manifest.json").exists():
        return out
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tinydata-", dir=base))
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs = make_corpus()
    for name, texts in (("corpus.jsonl", docs), (TITAN_LAYOUT, docs), (HELD_OUT, make_corpus(60, seed=1))):
        (tmp / name).parent.mkdir(exist_ok=True)
        with open(tmp / name, "w", encoding="utf-8") as f:
            for doc in texts:
                f.write(json.dumps({"text": doc}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    tok.save(str(tmp / "tokenizer.json"))
    with open(tmp / "tokenizer_config.json", "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": False, "add_eos_token": False,
                   "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
    with open(tmp / "manifest.json", "w") as f:
        json.dump({"version": VERSION, "vocab_size": tok.get_vocab_size(), "docs": len(docs)}, f)
    try:
        os.replace(tmp, out)  # atomic: a concurrent builder either wins or finds ours
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "manifest.json").exists():
            raise
    return out
