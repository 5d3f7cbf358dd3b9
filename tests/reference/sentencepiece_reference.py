#!/usr/bin/python3
"""Reference for the SentencePiece tokenizer parity tests: Debian's python3-sentencepiece, with
Megatron's three wrappers (SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer)
written out here from their documented behaviour.

  sentencepiece_reference.py train --input TEXT.txt --model-prefix P --model-type bpe|unigram
                                   --vocab-size N
      trains P.model on the lines of TEXT.txt
  sentencepiece_reference.py encode --model P.model --flavor FLAVOR [--vocab-extra-ids N]
                                    [--hex] --out IDS.bin --decoded DECODED.jsonl FILE.jsonl...
      for every {"text"} line: uint32 count then the ids (little-endian) in IDS.bin, and
      {"text": decode(ids)} in DECODED.jsonl; the first line of DECODED.jsonl is
      {"vocab_size", "eod", "bos", "eos", "pad"}. --hex: the lines are {"hex": "..."}, raw bytes
      that may hold invalid UTF-8; SentencePieceProcessor takes bytes as well as str, so they go
      to it as they are (the wrappers' special-token search runs on the bytes)
  sentencepiece_reference.py decode --model P.model --flavor FLAVOR [--vocab-extra-ids N] IDS.json
      IDS.json: [[id, ...], ...]; prints the JSON list of their decoded texts
  sentencepiece_reference.py bench --model P.model --flavor FLAVOR FILE.jsonl...
      encodes every text once on one thread (texts read first) and prints
      {"bytes","documents","tokens","seconds","mb_per_s","tokens_per_s"}
"""
import argparse
import json
import struct
import sys
import time

import sentencepiece


class MegatronSentencePiece:
    """Megatron's wrappers around one SentencePieceProcessor."""

    def __init__(self, model, flavor, vocab_extra_ids):
        self.sp = sentencepiece.SentencePieceProcessor(model_file=model)
        self.flavor = flavor
        n = self.sp.get_piece_size()
        self.vocab = {self.sp.id_to_piece(i): i for i in range(n)}
        self.specials = {}  # token -> id, in the order they are added
        self.bos = self.sp.bos_id()
        self.eos = self.sp.eos_id()
        self.pad = self.sp.pad_id()
        self.eod = self.eos
        if flavor != "SentencePieceTokenizer":
            return

        def add(token):
            if token not in self.vocab:
                self.vocab[token] = len(self.vocab)
            self.specials.setdefault(token, self.vocab[token])
            return self.vocab[token]

        def piece_or(i, fallback):
            return self.sp.id_to_piece(i) if 0 <= i < n else fallback

        add("<CLS>")
        add("<SEP>")
        self.eod = add("<EOD>")
        add("<MASK>")
        self.pad = add(piece_or(self.sp.pad_id(), "<PAD>"))
        self.bos = add(piece_or(self.sp.bos_id(), "<BOS>"))
        self.eos = add(piece_or(self.sp.eos_id(), "<EOS>"))
        for i in range(vocab_extra_ids):
            add("<extra_id_%d>" % i)
        self.special_of_id = {i: t for t, i in self.specials.items()}

    def vocab_size(self):
        return len(self.vocab)

    def tokenize(self, text):
        if self.flavor == "GPTSentencePieceTokenizer":
            return self.sp.encode_as_ids(text)
        if self.flavor == "Llama2Tokenizer":
            return [self.bos] + self.sp.encode(text)
        ids, idx = [], 0
        raw = isinstance(text, bytes)
        while True:
            found = {}
            for token in self.specials:
                at = text.find(token.encode() if raw else token, idx)
                if at >= 0:
                    found[token] = at
            if not found:
                break
            token = min(found, key=found.get)
            ids += self.sp.encode_as_ids(text[idx:found[token]])
            ids.append(self.specials[token])
            idx = found[token] + len(token.encode() if raw else token)
        return ids + self.sp.encode_as_ids(text[idx:])

    def detokenize(self, ids):
        if self.flavor != "SentencePieceTokenizer":
            return self.sp.decode_ids(ids)
        text, last = "", 0
        for i, t in enumerate(ids):
            if t in self.special_of_id:
                text += self.sp.decode_ids(ids[last:i]) + " " + self.special_of_id[t] + " "
                last = i + 1
        return text + self.sp.decode_ids(ids[last:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "encode", "decode", "bench"])
    p.add_argument("--input")
    p.add_argument("--model-prefix")
    p.add_argument("--model-type")
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--model")
    p.add_argument("--flavor")
    p.add_argument("--vocab-extra-ids", type=int, default=0)
    p.add_argument("--out")
    p.add_argument("--decoded")
    p.add_argument("--hex", action="store_true")
    p.add_argument("files", nargs="*")
    a = p.parse_intermixed_args()
    if a.mode == "train":
        sentencepiece.SentencePieceTrainer.train(
            input=a.input, model_prefix=a.model_prefix, model_type=a.model_type,
            vocab_size=a.vocab_size, character_coverage=0.9995, num_threads=1,
            minloglevel=2, seed_sentencepiece_size=100000, input_sentence_size=0,
            shuffle_input_sentence=False)
        return
    tok = MegatronSentencePiece(a.model, a.flavor, a.vocab_extra_ids)
    if a.mode == "decode":
        with open(a.files[0]) as f:
            print(json.dumps([tok.detokenize(ids) for ids in json.load(f)]))
        return
    if a.mode == "bench":
        texts = []
        for f in a.files:
            with open(f, encoding="utf-8") as fin:
                texts += [json.loads(line)["text"] for line in fin if line.strip()]
        size = sum(len(t.encode("utf-8")) for t in texts)
        tok.tokenize(texts[0] if texts else "")
        t0 = time.perf_counter()
        tokens = sum(len(tok.tokenize(t)) for t in texts)
        seconds = time.perf_counter() - t0
        print(json.dumps({"bytes": size, "documents": len(texts), "tokens": tokens,
                          "seconds": seconds, "mb_per_s": size / 1e6 / seconds,
                          "tokens_per_s": tokens / seconds}))
        return
    with open(a.out, "wb") as ids_out, open(a.decoded, "w", encoding="utf-8") as dec_out:
        dec_out.write(json.dumps({"vocab_size": tok.vocab_size(), "eod": tok.eod, "bos": tok.bos,
                                  "eos": tok.eos, "pad": tok.pad}) + "\n")
        for f in a.files:
            with open(f, encoding="utf-8") as fin:
                for line in fin:
                    if not line.strip():
                        continue
                    doc = json.loads(line)
                    ids = tok.tokenize(bytes.fromhex(doc["hex"]) if a.hex else doc["text"])
                    ids_out.write(struct.pack("<I%dI" % len(ids), len(ids), *ids))
                    dec_out.write(json.dumps({"text": tok.detokenize(ids)}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
