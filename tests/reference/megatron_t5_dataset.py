#!/usr/bin/python3
"""Reference for the T5 span-corruption dataset: Megatron-LM's algorithm transcribed to Python with
NumPy, from megatron/core/datasets/t5_dataset.py (T5MaskedWordPieceDataset.__getitem__,
_get_token_mask, _build_b1ss_attention_mask as config_attention_mask uses it with
--transformer-impl local), masked_dataset.py (_create_masked_lm_predictions with
masking_use_geometric_distribution), pretrain_t5.py (target length sequence_length - 2, one
sentence at least per sample, masking_max_ngram 10, whole words, no permutation, no longer
n-grams, geometric n-gram lengths) and megatron/training/tokenizer/tokenizer.py
(_BertWordPieceTokenizer: [BOS], [EOS], <extra_id_k> appended; additional_special_tokens_ids).
The sample mapping, the masking loop (with T5's settings), the blend and the split rules are those
of megatron_bert_dataset.py, imported.
Per-sample randomness is numpy.random.RandomState, as Megatron uses it.

Reads one JSON request per line on stdin, writes one JSON answer per line:
  {"op": "samples", "vocab_file": F, "vocab_extra_ids": 100, "encoder_seq_length": E,
   "decoder_seq_length": D, "seed": s, "mask_prob": p, "short_seq_prob": q,
   "num_samples": [tr, va, te], "data_path": [...] | "train_data_path"/...: [...],
   "split": "969,30,1", "surplus": 0.005, "split_name": "train", "count": k}
      -> {"size": n, "samples": [dict, ...]}   the first k samples of that split
  {"op": "vocab", "vocab_file": F, "vocab_extra_ids": k}
      -> {"size": n, "bos": .., "eos": .., "additional_special_tokens_ids": [...]}
  {"op": "geometric", "seed": s, "p": p, "count": n} -> {"values": [...]}  RandomState.geometric
  {"op": "local_masks", "tokens_enc": [[...]], "tokens_dec": [[...]]}
      -> {"enc_mask": .., "dec_mask": .., "enc_dec_mask": ..}   [b, 1, q, kv] lists, 1 = masked
"""
import json
import os
import sys
from collections import deque

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_bert_dataset import BertDataset, BertTokenizerVocab, mapping_for  # noqa: E402
from megatron_bert_dataset import samples as bert_samples  # noqa: E402

MAX_NGRAM = 10


class T5TokenizerVocab(BertTokenizerVocab):
    def __init__(self, vocab_file, vocab_extra_ids):
        super().__init__(vocab_file, vocab_extra_ids)
        self.bos = self.vocab["[BOS]"]
        self.eos = self.vocab["[EOS]"]
        self.additional_special_tokens_ids = [self.vocab.get("<extra_id_{}>".format(i))
                                              for i in range(vocab_extra_ids)]


class T5Dataset(BertDataset):
    """BertDataset's masking (masked_dataset.py's _create_masked_lm_predictions) with T5's settings."""

    def __init__(self, dataset, documents, num_samples, config, tokenizer):
        assert len(tokenizer.additional_special_tokens_ids) > 0
        self.dataset = dataset
        self.config = dict(config, masking_max_ngram=MAX_NGRAM, masking_use_geometric_distribution=True)
        self.tokenizer = tokenizer
        self.sample_index = mapping_for(dataset, documents, num_samples, config["encoder_seq_length"] - 2,
                                        config["short_seq_prob"], config["seed"], 1)

    def _get_token_mask(self, rs):
        return self.tokenizer.mask

    def __getitem__(self, idx):
        idx_beg, idx_end, target_sequence_length = self.sample_index[idx]
        sample = [self.dataset[i] for i in range(idx_beg, idx_end)]
        rs = numpy.random.RandomState(seed=(self.config["seed"] + idx) % 2 ** 32)
        assert target_sequence_length <= self.config["encoder_seq_length"]
        tokens = [int(token) for sentence in sample for token in sentence]
        truncated = len(tokens) > target_sequence_length
        tokens = tokens[:target_sequence_length]
        tokens, _, _, masked_spans = self._create_masked_lm_predictions(tokens, target_sequence_length, rs)
        sentinels = deque(self.tokenizer.additional_special_tokens_ids)
        encoder_input = []
        decoder_input = [self.tokenizer.bos]
        decoder_output = []
        idx_beg = 0
        for indices, labels in masked_spans:
            sentinel = sentinels.popleft()
            idx_end = indices[0]
            encoder_input.extend(tokens[idx_beg:idx_end])
            encoder_input.append(sentinel)
            decoder_input.append(sentinel)
            decoder_input.extend(labels)
            decoder_output.append(sentinel)
            decoder_output.extend(labels)
            idx_beg = indices[-1] + 1
        encoder_input.extend(tokens[idx_beg:])
        decoder_output.append(self.tokenizer.eos)
        se, sd = self.config["encoder_seq_length"], self.config["decoder_seq_length"]
        length_toks_encoder = len(encoder_input)
        length_toks_decoder = len(decoder_input)
        length_pads_encoder = se - length_toks_encoder
        length_pads_decoder = sd - length_toks_decoder
        assert length_pads_encoder >= 0
        assert length_pads_decoder >= 0
        pad = self.tokenizer.pad
        encoder_input = numpy.pad(numpy.array(encoder_input, dtype=numpy.int64), (0, length_pads_encoder),
                                  constant_values=pad)
        decoder_input = numpy.pad(numpy.array(decoder_input, dtype=numpy.int64), (0, length_pads_decoder),
                                  constant_values=pad)
        mask_encoder = numpy.array([1] * length_toks_encoder + [0] * length_pads_encoder)
        mask_decoder = numpy.array([1] * length_toks_decoder + [0] * length_pads_decoder)
        decoder_output = numpy.pad(numpy.array(decoder_output, dtype=numpy.int64), (0, length_pads_decoder),
                                   constant_values=-1)
        loss_mask = numpy.zeros(sd, dtype=numpy.int64)
        loss_mask[:length_toks_decoder] = 1
        return {"text_enc": encoder_input.tolist(), "text_dec": decoder_input.tolist(),
                "labels": decoder_output.tolist(), "loss_mask": loss_mask.tolist(), "truncated": int(truncated),
                "enc_mask": mask_encoder.tolist(), "dec_mask": mask_decoder.tolist()}


def build_b1ss_attention_mask(source_block, target_block, make_history_mask=False):
    out = []
    for source_sample, target_sample in zip(source_block, target_block):
        mask = (target_sample[None, :] >= 1) * (source_sample[:, None] >= 1)
        if make_history_mask:
            arange = numpy.arange(source_sample.shape[0])
            mask = mask * (arange[None, ] <= arange[:, None])
        out.append(~mask)
    return numpy.stack(out)[:, None].astype(numpy.int64)


def samples(req):
    tokenizer = T5TokenizerVocab(req["vocab_file"], req.get("vocab_extra_ids", 100))
    return bert_samples(req, tokenizer, T5Dataset)


def main():
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "samples":
            out = samples(req)
        elif op == "vocab":
            t = T5TokenizerVocab(req["vocab_file"], req["vocab_extra_ids"])
            out = {"size": len(t.vocab), "bos": t.bos, "eos": t.eos,
                   "additional_special_tokens_ids": t.additional_special_tokens_ids}
        elif op == "geometric":
            rs = numpy.random.RandomState(req["seed"])
            out = {"values": [int(rs.geometric(req["p"])) for _ in range(req["count"])]}
        elif op == "local_masks":
            enc = numpy.array(req["tokens_enc"], dtype=numpy.int64)
            dec = numpy.array(req["tokens_dec"], dtype=numpy.int64)
            out = {"enc_mask": build_b1ss_attention_mask(enc, enc).tolist(),
                   "dec_mask": build_b1ss_attention_mask(dec, dec, make_history_mask=True).tolist(),
                   "enc_dec_mask": build_b1ss_attention_mask(dec, enc).tolist()}
        else:
            raise ValueError(op)
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
