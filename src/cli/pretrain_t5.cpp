// `megatron pretrain-t5`: Megatron-LM's pretrain_t5.py on pretrain-gpt's flags (model, batch,
// schedule, precision, parallelism, checkpoint, evaluation, logging; pretrain_gpt.cpp) plus T5's:
// --encoder-num-layers, the data library's --encoder-seq-length / --decoder-seq-length,
// --mask-prob, --short-seq-prob (cli/bert_data_flags.h; --decoder-num-layers and
// --relative-attention-num-buckets / --relative-attention-max-distance are model settings:
// model/model_settings.cpp), and
// --tokenizer-type BertWordPieceLowerCase by default (pretrain_t5.py's args_defaults). The model
// is model::T5Model; data come from Megatron's T5 span-corruption dataset over --data-path
// (sentence-split WordPiece data, --vocab-extra-ids sentinels; data/t5_dataset.h) or from
// --mock-data (training/t5_mock_data.h). The command is registered with pretrain-gpt's
// (pretrain_gpt.cpp), whose run it shares.
#include "cli/pretrain_flags.h"
#include "core/error.h"

namespace megatron::cli {

void add_t5_flags(CLI::App& sub, T5Flags& f) {
  sub.add_option("--encoder-num-layers", f.encoder_num_layers,
                 "Encoder layers (instead of --num-layers)");
  add_t5_data_flags(sub, f.data);
}

void apply_t5_flags(const T5Flags& f, const ModelFlags& flags, training::TrainingArgs& a) {
  model::TransformerConfig& m = a.model;
  m.model_family = model::kind_name(model::ModelFamilyId::t5);
  if (f.encoder_num_layers > 0) {
    MG_REQUIRE(!flags.given("--num-layers"),
               "cannot have both --num-layers and --encoder-num-layers (Megatron's validate_args)");
    m.num_layers = f.encoder_num_layers;
  }
  MG_REQUIRE(m.num_layers > 0, "pretrain-t5 needs --num-layers or --encoder-num-layers");
  if (f.data.encoder_seq_length > 0) {
    MG_REQUIRE(!flags.given("--seq-length"),
               "cannot have both --seq-length and --encoder-seq-length (Megatron's validate_args)");
    m.seq_length = int(f.data.encoder_seq_length);
    if (!flags.given("--max-position-embeddings") && m.max_position_embeddings == 0)
      m.max_position_embeddings = m.seq_length;
  }
  MG_REQUIRE(m.seq_length > 0, "pretrain-t5 needs --encoder-seq-length (or --seq-length)");
  MG_REQUIRE(f.data.decoder_seq_length > 0, "pretrain-t5 needs --decoder-seq-length (the decoder's "
             "tokens per sample)");
  m.decoder_seq_length = int(f.data.decoder_seq_length);
  a.mask_prob = f.data.mask_prob;
  a.short_seq_prob = f.data.short_seq_prob;
}

}  // namespace megatron::cli
