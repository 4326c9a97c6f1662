// The newest complete checkpoint of a directory as bytes, for tests that require a resumed
// or restarted run to end bit for bit where an uninterrupted run ends.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "model/io/checkpoint.h"

namespace difftrain::testing {

// Every tensor of every shard of the newest complete checkpoint in `dir`, keyed
// "RANK/NAME"; sets *step to its step. Empty when there is none.
inline std::map<std::string, std::string> NewestCheckpointTensors(const std::filesystem::path& dir,
                                                                  int64_t* step) {
  io::CheckpointStore store(dir.string(), 0);
  std::map<std::string, std::string> tensors;
  Result<std::optional<int64_t>> latest = store.LatestComplete();
  EXPECT_TRUE(latest.ok()) << latest.status().message();
  if (!latest.ok() || !*latest) return tensors;
  *step = **latest;
  const Result<int> world = store.World(*step);
  EXPECT_TRUE(world.ok()) << world.status().message();
  for (int r = 0; world.ok() && r < *world; ++r) {
    Result<io::SafetensorsFile> shard = store.ReadShard(*step, r, *world);
    EXPECT_TRUE(shard.ok()) << shard.status().message();
    if (!shard.ok()) continue;
    for (const std::string& name : shard->Names()) {
      const io::TensorView* t = shard->Find(name);
      tensors[std::to_string(r) + "/" + name] =
          std::string(reinterpret_cast<const char*>(t->data), t->bytes);
    }
  }
  return tensors;
}

// The same tensors with the same bytes; names the first few that differ.
inline void ExpectIdenticalTensors(const std::map<std::string, std::string>& got,
                                   const std::map<std::string, std::string>& want) {
  ASSERT_EQ(got.size(), want.size());
  int differing = 0;
  for (const auto& [name, bytes] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    if (it->second != bytes && ++differing <= 5) ADD_FAILURE() << name << " differs";
  }
  EXPECT_EQ(differing, 0) << "tensors differ from the uninterrupted run";
}

}  // namespace difftrain::testing
