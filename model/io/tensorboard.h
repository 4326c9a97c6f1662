// TensorBoard's event files, written without TensorFlow: what diffusers' scripts log with
// `--report_to tensorboard` (accelerate's TensorBoardTracker, torch's SummaryWriter), so that
// `tensorboard --logdir DIR` draws a run's loss, learning rate and samples.
//
// A file `DIR/events.out.tfevents.<seconds>.<host>.<pid>.0` is a sequence of TFRecords (a
// little-endian uint64 length, its masked CRC-32C, the data, the data's masked CRC-32C), each
// an `Event` protocol buffer (tensorboard/compat/proto/event.proto): the first holds
// `file_version` "brain.Event:2", each later one a step's `Summary` of scalars
// (`simple_value`) or a PNG image, or a `SessionLog` START. Each event is flushed as written:
// TensorBoard reads the file while the run appends to it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace difftrain::io {

// CRC-32C (Castagnoli) of `data`, and the masked form TFRecords store:
// ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t Crc32c(std::string_view data);
uint32_t MaskedCrc32c(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it, and writes the file_version
  // event.
  static Result<TensorBoardWriter> Open(const std::string& dir);
  TensorBoardWriter(TensorBoardWriter&& other) noexcept;
  TensorBoardWriter& operator=(TensorBoardWriter&& other) noexcept;
  ~TensorBoardWriter();

  // A SessionLog START at `step`: TensorBoard drops the events of step `step` and later that
  // files written before this one hold (torch's SummaryWriter(purge_step=step)), which is what
  // a run resumed from a checkpoint before them retrains.
  Status Restart(int64_t step);
  // One event of `step`: each (tag, value) a scalar.
  Status Scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // One event of `step`: an image summary `tag` of the PNG file `png` (its bytes), of
  // `height` × `width` pixels and `channels` (1 grey, 3 RGB, 4 RGBA).
  Status Image(int64_t step, const std::string& tag, const std::string& png, int height, int width,
               int channels);

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  // An Event of `step` at the wall time now, holding `body` (encoded fields after wall_time
  // and step), as one flushed record.
  Status Write(int64_t step, const std::string& body);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace difftrain::io
