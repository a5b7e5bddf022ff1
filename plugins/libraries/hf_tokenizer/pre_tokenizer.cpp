#include "pre_tokenizer.hpp"

#include <cctype>
#include <optional>

namespace trainyard {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

struct Segment {
  std::size_t begin, end;
  bool match;
};

// HF's SplitDelimiterBehavior, applied to the segments (matches and the gaps between them) as
// they arrive: what it would compute over the whole list, emitted as soon as it is final.
class SegmentFolder {
 public:
  SegmentFolder(SplitBehavior behavior, std::string_view piece, bool at_start, PieceSink sink)
      : behavior_(behavior), piece_(piece), at_start_(at_start), sink_(sink) {}

  void add(Segment segment) {
    switch (behavior_) {
      case SplitBehavior::isolated:
        emit(segment.begin, segment.end);
        break;
      case SplitBehavior::removed:
        if (!segment.match) emit(segment.begin, segment.end);
        break;
      case SplitBehavior::contiguous:
        if (pending_ && segment.match == previous_match_) {
          pending_->end = segment.end;
        } else {
          flush();
          pending_ = segment;
        }
        break;
      case SplitBehavior::merged_with_previous:
        if (pending_ && segment.match && !previous_match_) {
          pending_->end = segment.end;
        } else {
          flush();
          pending_ = segment;
        }
        break;
      case SplitBehavior::merged_with_next:
        // A match joins the non-match right after it.
        if (pending_ && pending_->match && !segment.match) {
          emit(pending_->begin, segment.end);
          pending_.reset();
        } else {
          flush();
          if (segment.match) {
            pending_ = segment;
          } else {
            emit(segment.begin, segment.end);
          }
        }
        break;
    }
    previous_match_ = segment.match;
  }
  void flush() {
    if (pending_) emit(pending_->begin, pending_->end);
    pending_.reset();
  }

 private:
  void emit(std::size_t begin, std::size_t end) {
    if (begin < end) sink_(piece_.substr(begin, end - begin), at_start_ && begin == 0);
  }
  SplitBehavior behavior_;
  std::string_view piece_;
  bool at_start_;
  PieceSink sink_;
  std::optional<Segment> pending_;
  bool previous_match_ = false;
};

void split_by_regex(const Regex& regex, SplitBehavior behavior, bool invert, std::string_view piece,
                    bool at_start, EncodeScratch& scratch, PieceSink sink) {
  if (behavior == SplitBehavior::isolated) {
    // The hot path (GPT-2, Llama 3): every segment is a word, whatever invert says.
    std::size_t previous = 0;
    regex.for_each_match(piece, scratch.regex, [&](std::size_t begin, std::size_t end) {
      if (previous < begin)
        sink(piece.substr(previous, begin - previous), at_start && previous == 0);
      if (begin < end) sink(piece.substr(begin, end - begin), at_start && begin == 0);
      previous = end;
    });
    if (previous < piece.size()) sink(piece.substr(previous), at_start && previous == 0);
    return;
  }
  SegmentFolder folder(behavior, piece, at_start, sink);
  std::size_t previous = 0;
  regex.for_each_match(piece, scratch.regex, [&](std::size_t begin, std::size_t end) {
    if (previous != begin) folder.add({previous, begin, invert});
    folder.add({begin, end, !invert});
    previous = end;
  });
  if (previous != piece.size()) folder.add({previous, piece.size(), invert});
  folder.flush();
}

}  // namespace

std::string escape_regex(std::string_view literal) {
  std::string out;
  for (const char c : literal) {
    if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c)))
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space),
      regex_(use_regex ? std::make_unique<Regex>(kGpt2Pattern) : nullptr) {}

void ByteLevelPreTokenizer::pre_tokenize(std::string_view piece, bool at_start,
                                         EncodeScratch& scratch, PieceSink sink) const {
  std::string prefixed;
  if (add_prefix_space_ && !piece.empty() && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed.append(" ").append(piece);
    piece = prefixed;
  }
  if (regex_) {
    split_by_regex(*regex_, SplitBehavior::isolated, false, piece, at_start, scratch, sink);
  } else if (!piece.empty()) {
    sink(piece, at_start);
  }
}

SplitPreTokenizer::SplitPreTokenizer(std::unique_ptr<Regex> regex, SplitBehavior behavior,
                                     bool invert)
    : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}

void SplitPreTokenizer::pre_tokenize(std::string_view piece, bool at_start, EncodeScratch& scratch,
                                     PieceSink sink) const {
  split_by_regex(*regex_, behavior_, invert_, piece, at_start, scratch, sink);
}

MetaspacePreTokenizer::MetaspacePreTokenizer(std::string replacement, PrependScheme prepend,
                                             bool split)
    : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}

void MetaspacePreTokenizer::pre_tokenize(std::string_view piece, bool at_start, EncodeScratch&,
                                         PieceSink sink) const {
  std::string text;
  const bool starts = piece.rfind(' ', 0) == 0 || piece.rfind(replacement_, 0) == 0;
  const bool prepend =
      !piece.empty() && !starts &&
      (prepend_ == PrependScheme::always || (prepend_ == PrependScheme::first && at_start));
  text.reserve(piece.size() + replacement_.size() * 4);
  if (prepend) text.append(replacement_);
  for (const char c : piece) {
    if (c == ' ') {
      text.append(replacement_);
    } else {
      text.push_back(c);
    }
  }
  if (!split_) {
    if (!text.empty()) sink(text, at_start);
    return;
  }
  // Split before each replacement: "▁a▁▁b" -> "▁a", "▁", "▁b" (MergedWithNext).
  std::size_t begin = 0;
  std::size_t at = text.find(replacement_, 1);
  while (at != std::string::npos) {
    sink(std::string_view(text).substr(begin, at - begin), at_start && begin == 0);
    begin = at;
    at = text.find(replacement_, at + replacement_.size());
  }
  if (begin < text.size()) sink(std::string_view(text).substr(begin), at_start && begin == 0);
}

void SequencePreTokenizer::pre_tokenize(std::string_view piece, bool at_start,
                                        EncodeScratch& scratch, PieceSink sink) const {
  run(0, piece, at_start, scratch, sink);
}

void SequencePreTokenizer::run(std::size_t step, std::string_view piece, bool at_start,
                               EncodeScratch& scratch, PieceSink sink) const {
  if (step == steps_.size()) {
    sink(piece, at_start);
    return;
  }
  steps_[step]->pre_tokenize(piece, at_start, scratch,
                             [&](std::string_view word, bool word_at_start) {
                               run(step + 1, word, word_at_start, scratch, sink);
                             });
}

}  // namespace trainyard
