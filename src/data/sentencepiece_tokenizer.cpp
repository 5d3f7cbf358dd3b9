// SentencePiece tokenizers; see sentencepiece_tokenizer.h for Megatron's three wrappers.
#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "core/error.h"

namespace megatron::data {

namespace {

const char* flavor_name(SentencePieceTokenizer::Flavor f) {
  switch (f) {
    case SentencePieceTokenizer::Flavor::kSentencePiece: return "SentencePieceTokenizer";
    case SentencePieceTokenizer::Flavor::kGPTSentencePiece: return "GPTSentencePieceTokenizer";
    case SentencePieceTokenizer::Flavor::kLlama2: return "Llama2Tokenizer";
  }
  return "?";
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, Flavor flavor,
                                               int vocab_extra_ids)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), flavor_(flavor) {
  namespace fs = std::filesystem;
  const char* name = flavor_name(flavor);
  MG_REQUIRE(fs::is_regular_file(model_file), "--tokenizer-model '", model_file,
             "' does not exist or is not a file; ", name,
             " needs a SentencePiece model (e.g. Llama-2's tokenizer.model)");
  const auto status = sp_->Load(model_file);
  MG_REQUIRE(status.ok(), "--tokenizer-model '", model_file, "' is not a SentencePiece model (",
             status.ToString(), "); ", name, " needs a .model file written by spm_train");
  MG_REQUIRE(vocab_extra_ids >= 0, "--vocab-extra-ids must be >= 0, got ", vocab_extra_ids);
  MG_REQUIRE(vocab_extra_ids == 0 || flavor == Flavor::kSentencePiece, "--vocab-extra-ids ",
             vocab_extra_ids, " is only used by SentencePieceTokenizer, not ", name);
  pieces_ = sp_->GetPieceSize();
  vocab_size_ = pieces_;
  auto valid = [&](int id) -> std::optional<int32_t> {
    return id >= 0 && id < pieces_ ? std::optional<int32_t>(id) : std::nullopt;
  };
  if (flavor != Flavor::kSentencePiece) {
    bos_ = valid(sp_->bos_id());
    eos_ = valid(sp_->eos_id());
    pad_ = valid(sp_->pad_id());
    eod_ = eos_;
    MG_REQUIRE(flavor != Flavor::kLlama2 || bos_, "--tokenizer-model '", model_file,
               "' has no BOS piece (bos_id = ", sp_->bos_id(),
               "); Llama2Tokenizer starts every text with BOS, use GPTSentencePieceTokenizer");
    return;
  }

  // Megatron's _SentencePieceTokenizer._initalize: specials appended unless already pieces.
  auto add_special = [&](const std::string& token) {
    int32_t id = -1;
    const int found = sp_->PieceToId(token);
    // PieceToId answers unk_id for unknown pieces; only an exact piece match counts.
    if (found >= 0 && found < pieces_ && sp_->IdToPiece(found) == token) {
      id = found;
    } else {
      for (size_t k = 0; k < added_.size(); ++k)
        if (added_[k] == token) id = pieces_ + int32_t(k);
      if (id < 0) {
        id = int32_t(vocab_size_++);
        added_.push_back(token);
      }
    }
    bool listed = false;
    for (const auto& s : specials_) listed |= s.first == token;
    if (!listed) {
      specials_.emplace_back(token, id);
      special_of_id_[id] = token;
    }
    return id;
  };
  auto piece_or = [&](int id, const char* fallback) {
    return id >= 0 && id < pieces_ ? sp_->IdToPiece(id) : std::string(fallback);
  };
  cls_ = add_special("<CLS>");
  sep_ = add_special("<SEP>");
  eod_ = add_special("<EOD>");
  mask_ = add_special("<MASK>");
  pad_ = add_special(piece_or(sp_->pad_id(), "<PAD>"));
  bos_ = add_special(piece_or(sp_->bos_id(), "<BOS>"));
  eos_ = add_special(piece_or(sp_->eos_id(), "<EOS>"));
  for (int i = 0; i < vocab_extra_ids; ++i)
    extra_ids_.push_back(add_special("<extra_id_" + std::to_string(i) + ">"));
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::string SentencePieceTokenizer::type() const { return flavor_name(flavor_); }

void SentencePieceTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  MG_REQUIRE(status.ok(), type(), ": SentencePiece could not encode a text (", status.ToString(), ")");
  out.insert(out.end(), ids.begin(), ids.end());
}

void SentencePieceTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (flavor_ == Flavor::kLlama2) out.push_back(*bos_);
  if (flavor_ != Flavor::kSentencePiece) {
    encode_plain(text, out);
    return;
  }
  // Next occurrence of each special token at or after `from` (npos: none left).
  std::vector<size_t> next(specials_.size());
  for (size_t k = 0; k < specials_.size(); ++k) next[k] = text.find(specials_[k].first);
  size_t pos = 0;
  for (;;) {
    size_t best = std::string_view::npos, which = 0;
    for (size_t k = 0; k < specials_.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < pos) next[k] = text.find(specials_[k].first, pos);
      if (next[k] < best) best = next[k], which = k;
    }
    if (best == std::string_view::npos) break;
    encode_plain(text.substr(pos, best - pos), out);
    out.push_back(specials_[which].second);
    pos = best + specials_[which].first.size();
  }
  encode_plain(text.substr(pos), out);
}

std::string SentencePieceTokenizer::decode_plain(std::span<const int32_t> ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  std::string text;
  const auto status = sp_->Decode(v, &text);
  MG_REQUIRE(status.ok(), type(), ": SentencePiece could not decode ids (", status.ToString(), ")");
  return text;
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  for (int32_t id : ids)
    MG_REQUIRE(id >= 0 && id < vocab_size_, type(), ": cannot decode id ", id,
               ", outside the vocabulary [0, ", vocab_size_, ")");
  if (flavor_ != Flavor::kSentencePiece) return decode_plain(ids);
  // Megatron's detokenize: special tokens as " TOKEN " between decoded runs.
  std::string text;
  size_t last = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = special_of_id_.find(ids[i]);
    if (it == special_of_id_.end()) continue;
    text += decode_plain(ids.subspan(last, i - last));
    text += ' ';
    text += it->second;
    text += ' ';
    last = i + 1;
  }
  text += decode_plain(ids.subspan(last));
  return text;
}

std::string SentencePieceTokenizer::piece(int32_t id) const {
  MG_REQUIRE(id >= 0 && id < vocab_size_, type(), ": id ", id, " is outside the vocabulary [0, ",
             vocab_size_, ")");
  return id < pieces_ ? sp_->IdToPiece(id) : added_[size_t(id - pieces_)];
}

}  // namespace megatron::data
