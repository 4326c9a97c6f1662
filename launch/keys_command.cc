// `difftrain keys --out DIR`: the CURVE keys of a job (common/curve.h).
#include <cstdio>

#include "common/curve.h"
#include "launch/command.h"

namespace difftrain::launch {
namespace {

DIFFTRAIN_COMMAND(
    kKeys,
    {"keys", "Write a job's CURVE keys into a directory only you can read", [](CLI::App& app) {
       auto out = std::make_shared<std::string>();
       app.add_option("--out", *out, "directory (created 0700; files 0600)")->required();
       return [out] {
         if (Status s = WriteNewKeys(*out); !s.ok()) {
           return ReportBadInput("keys", s.message());
         }
         std::printf(
             "difftrain keys: wrote %s/controller.key and "
             "%s/client.key\n",
             out->c_str(), out->c_str());
         return kExitOk;
       };
     }});

}  // namespace
}  // namespace difftrain::launch
