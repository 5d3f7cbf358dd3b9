"""Reference for the BERT WordPiece parity test: the published BERT basic tokenizer + greedy
WordPiece algorithm written with Python's own unicodedata and str.lower (what Megatron's
bert_tokenization.py relies on), stdlib only.

  python3 bert_wordpiece_reference.py make-vocab OUT.txt FILE.jsonl...
      writes a vocab.txt: [PAD] [UNK] [CLS] [SEP] [MASK], every character seen (plain and
      ##-prefixed), common suffixes, and the 4000 (env VOCAB_WORDS) most frequent lower-cased words
  python3 bert_wordpiece_reference.py encode VOCAB.txt lower|cased OUT.jsonl FILE.jsonl...
      writes one JSON list of ids per {"text": ...} line of the inputs, in order
"""
import collections
import json
import os
import sys
import unicodedata

MAX_WORD_CHARS = 200


def is_whitespace(c):
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def is_control(c):
    if c in "\t\n\r":
        return False
    return unicodedata.category(c) in ("Cc", "Cf")


def is_punctuation(c):
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text, lower):
    chars = []
    for c in text:
        cp = ord(c)
        if cp == 0 or cp == 0xFFFD or is_control(c):
            continue
        if is_whitespace(c):
            chars.append(" ")
        elif is_cjk(cp):
            chars.extend((" ", c, " "))
        else:
            chars.append(c)
    words = []
    for word in "".join(chars).split():
        if lower:
            word = word.lower()
            word = "".join(c for c in unicodedata.normalize("NFD", word)
                           if unicodedata.category(c) != "Mn")
        current = []
        for c in word:
            if is_punctuation(c):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(c)
            else:
                current.append(c)
        if current:
            words.append("".join(current))
    return " ".join(words).split()


def wordpiece(word, vocab, unk):
    if len(word) > MAX_WORD_CHARS:
        return [unk]
    ids, start = [], 0
    while start < len(word):
        end, found = len(word), None
        while start < end:
            piece = ("##" if start > 0 else "") + word[start:end]
            if piece in vocab:
                found = vocab[piece]
                break
            end -= 1
        if found is None:
            return [unk]
        ids.append(found)
        start = end
    return ids


def texts(files):
    for name in files:
        with open(name, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)["text"]


def make_vocab(out, files, words=4000):
    counts, chars = collections.Counter(), set()
    for t in texts(files):
        chars.update(c for c in t if not is_whitespace(c) and not is_control(c))
        for w in basic_tokenize(t, True):
            counts[w] += 1
            chars.update(w)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for c in sorted(chars):
        tokens += [c, "##" + c]
    tokens += ["##" + s for s in ("ing", "ed", "s", "es", "ly", "er", "tion", "ment", "able")]
    tokens += [w for w, _ in counts.most_common(words) if len(w) > 1]
    seen, unique = set(), []
    for t in tokens:
        if t not in seen and t.strip() == t and t:
            seen.add(t)
            unique.append(t)
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(unique) + "\n")


def encode(vocab_file, mode, out, files):
    with open(vocab_file, encoding="utf-8") as f:
        vocab = {line.strip(): i for i, line in enumerate(f)}
    lower = mode == "lower"
    with open(out, "w") as f:
        for t in texts(files):
            ids = []
            for w in basic_tokenize(t, lower):
                ids += wordpiece(w, vocab, vocab["[UNK]"])
            f.write(json.dumps(ids) + "\n")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "make-vocab":
        words = os.environ.get("VOCAB_WORDS")
        make_vocab(sys.argv[2], sys.argv[3:], int(words) if words else 4000)
    elif len(sys.argv) >= 6 and sys.argv[1] == "encode":
        encode(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        sys.exit(__doc__)
