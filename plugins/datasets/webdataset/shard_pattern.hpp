#pragma once
// Shard lists as WebDataset names them: "data/train-{000000..000099}.tar" is the hundred files
// train-000000.tar to train-000099.tar. Every {A..B} is a decimal range (either direction; zero
// padding kept: when A or B has a leading zero, every number is padded to the longer one's
// width) and every {x,y,z} a list of alternatives; several in one pattern expand left to right,
// the rightmost varying fastest. A pattern without braces is one path.

#include <string>
#include <vector>

namespace trainyard {

// Throws Error naming the pattern for an unclosed brace, a range that is not two decimal numbers,
// or more than a million names.
std::vector<std::string> expand_shard_pattern(const std::string& pattern);

}  // namespace trainyard
