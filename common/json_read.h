// Values read from JSON a user hands us (a pretrained folder's config.json, a scheduler's, a
// tokenizer's), checked. Integers with their range checked: nlohmann's get<int>() converts any
// number: a float past int's range is undefined behaviour, and an integer past it wraps. These take
// an integer, or a float with an integral value (a tool that wrote 64.0), within int's range;
// anything else throws nlohmann::json::type_error (not a number) or json::out_of_range (not an
// int), which the readers' catch of json::exception turns into an error naming the file.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace difftrain {

// `what` names the value in the message (a config key).
int JsonInt(const nlohmann::json& value, std::string_view what);
// `object`'s `key` as JsonInt reads it, `fallback` where the key is absent (nlohmann's
// value(key, fallback) with the range checked).
int JsonIntOr(const nlohmann::json& object, const char* key, int fallback);
// An array of them.
std::vector<int> JsonInts(const nlohmann::json& value, std::string_view what);

// `object`'s string `key`, `fallback` where the key is absent or holds no string: for telling
// one kind of file from another (a "_class_name" of another type is no class's), where
// nlohmann's value(key, fallback) throws.
std::string JsonStringOr(const nlohmann::json& object, const char* key, std::string fallback);

}  // namespace difftrain
