"""Build a small real-token corpus: a BPE tokenizer trained on real text, and a Megatron
indexed dataset (.bin/.idx) written with Megatron-Core's own ``IndexedDatasetBuilder``.

Used by the CPU data-pipeline test and by the GPU run of ``recipes/tiny-moe-real-data.yaml``:

    python tests/stack/tiny_corpus.py build/tiny-corpus        # from the project root

writes ``build/tiny-corpus/tokenizer/`` (a HuggingFace tokenizer directory that loads offline)
and ``build/tiny-corpus/text_document.{bin,idx}``. The text is this project's own prose and
source (README, docs, the compiler), one document per paragraph. Needs ``tokenizers``,
``transformers``, ``numpy`` and ``megatron-core`` (the .venv-stack or the GPU host).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EOD = "<|endoftext|>"
PAD = "<pad>"


def default_sources(root: Path = ROOT) -> list[Path]:
    """Real text that travels with every checkout: the docs and the compiler source."""
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "compiler").rglob("*.py"))]
    return [f for f in files if f.is_file()]


def documents(files: list[Path]) -> list[str]:
    """One document per blank-line-separated paragraph (real text, many documents)."""
    out: list[str] = []
    for f in files:
        for para in f.read_text(encoding="utf-8", errors="replace").split("\n\n"):
            if para.strip():
                out.append(para.strip())
    return out


def train_tokenizer(docs: list[str], out_dir: Path, vocab_size: int = 2048) -> Path:
    """A byte-level BPE tokenizer trained on ``docs``, saved as a HuggingFace tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOD, pad_token=PAD)
    path = out_dir / "tokenizer"
    fast.save_pretrained(str(path))
    return path


def write_indexed(docs: list[str], tokenizer_dir: Path, prefix: Path) -> dict[str, int]:
    """Tokenize each document (+ EOD) and write ``prefix``.bin/.idx with Megatron-Core's builder."""
    import numpy
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    eod = tok.convert_tokens_to_ids(EOD)
    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=DType.optimal_dtype(len(tok)))
    n_tokens = 0
    for doc in docs:
        ids = tok(doc, add_special_tokens=False)["input_ids"] + [eod]
        builder.add_document(numpy.array(ids, dtype=numpy.int64), [len(ids)])
        n_tokens += len(ids)
    builder.finalize(str(prefix) + ".idx")
    return {"documents": len(docs), "tokens": n_tokens, "vocab": len(tok), "eod": int(eod)}


def build(out_dir: Path, files: list[Path] | None = None, vocab_size: int = 2048) -> dict[str, object]:
    out_dir.mkdir(parents=True, exist_ok=True)
    docs = documents(files or default_sources())
    tokenizer_dir = train_tokenizer(docs, out_dir, vocab_size)
    prefix = out_dir / "text_document"
    stats = write_indexed(docs, tokenizer_dir, prefix)
    return {"prefix": str(prefix), "tokenizer": str(tokenizer_dir), **stats}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("files", nargs="*", type=Path, help="text files (default: README, docs, compiler source)")
    ap.add_argument("--vocab-size", type=int, default=2048)
    args = ap.parse_args(argv)
    print(json.dumps(build(args.out_dir, args.files or None, args.vocab_size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
