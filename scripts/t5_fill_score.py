#!/usr/bin/env python3
"""How well a T5 checkpoint fills held-out spans: the first word of each greedy fill against the
word the span really began with, beside always writing the most frequent first word.

  t5_fill_score.py prompts VOCAB SAMPLES OUT   SAMPLES: `megatron inspect-data --dataset-type t5
                                               --format json` lines; writes OUT.txt (each encoder
                                               input as a prompt, sentinels as <extra_id_N>) and
                                               OUT.json (each sample's spans, by sentinel)
  t5_fill_score.py score OUT GENERATED         GENERATED: `megatron generate --output-format jsonl`
                                               over OUT.txt; prints one line

Ids past the vocabulary file are BertWordPieceTokenizer's additions, in its order: [BOS], [EOS],
then <extra_id_0>, <extra_id_1>, ..."""
import collections
import json
import sys


def token(vocab, i):
    if i < len(vocab):
        return vocab[i]
    k = i - len(vocab)
    return "[BOS]" if k == 0 else "[EOS]" if k == 1 else f"<extra_id_{k - 2}>"


def words(pieces):  # WordPiece pieces to words ("##" continues the previous word)
    out = []
    for p in pieces:
        if p.startswith("##") and out:
            out[-1] += p[2:]
        else:
            out.append(p)
    return out


def prompts(vocab, samples_path, out):
    texts, spans = [], []
    with open(samples_path) as f:
        for line in f:
            s = json.loads(line)
            enc = [token(vocab, i) for i, m in zip(s["text_enc"], s["enc_mask"]) if m]
            texts.append(" ".join(words(enc)))
            cur, got = None, {}
            for i, m in zip(s["labels"], s["loss_mask"]):
                t = token(vocab, i) if m else None
                if t is None or t == "[EOS]":
                    break
                if t.startswith("<extra_id_"):
                    cur = got.setdefault(t, [])
                elif cur is not None:
                    cur.append(t)
            spans.append({k: words(v) for k, v in got.items()})
    with open(out + ".txt", "w") as f:
        f.write("\n".join(texts) + "\n")
    with open(out + ".json", "w") as f:
        json.dump(spans, f)


def score(out, generated_path):
    with open(out + ".json") as f:
        truth = json.load(f)
    with open(generated_path) as f:
        generated = [json.loads(l) for l in f if l.startswith("{")]
    if len(generated) != len(truth):
        sys.exit(f"{generated_path}: {len(generated)} results for {len(truth)} prompts")
    right, firsts, fills = 0, collections.Counter(), collections.Counter()
    for t, g in zip(truth, generated):
        for sentinel, span in t.items():
            if not span:
                continue
            filled = g["spans"].get(sentinel, "").split()
            first = filled[0] if filled else ""
            right += first == span[0]
            firsts[span[0]] += 1
            fills[first] += 1
    n = sum(firsts.values())
    if n == 0:
        sys.exit(f"{out}.json: no span to score")
    top, top_n = firsts.most_common(1)[0]
    print(f"greedy fills of {n} held-out spans: first word right {100 * right / n:.1f}% "
          f"(always \"{top}\": {100 * top_n / n:.1f}%); {len(fills)} distinct first words, most "
          f"often " + ", ".join(f"\"{w}\" {c}" for w, c in fills.most_common(3)))


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "prompts":
        with open(sys.argv[2], encoding="utf-8") as f:
            vocab = [l.rstrip("\n") for l in f]
        prompts(vocab, sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "score":
        score(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
