#include "model/text/unicode.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/ustring.h>

namespace difftrain::text {
namespace {

// Assigned characters whose general category changed between Unicode 8.0 and 15.0 in a way
// the tokenizers see (C*, Mn, P*, L*, N*), found by comparing every code point with the
// references (tests/tokenizer_reference_test.cc: the `unicode_categories` crate of
// `tokenizers` for 8.0, Python 3.11's unicodedata for 14.0). `until` is the last version
// with the old category. The tests pin the old category down at 8.0 (WordPiece); at 14.0 only as
// far as the CLIP tokenizer tells categories apart (letter, number, control, other). The versions
// of the changes in the comments are as recalled, not tested.
struct CategoryChange {
  char32_t c;
  int until;  // the category below holds for versions <= until
  UCharCategory category;
};
constexpr CategoryChange kCategoryChanges[] = {
    {0x1734, 1300, U_NON_SPACING_MARK},        // HANUNOO SIGN PAMUDPOD (Mc since 14.0)
    {0x1885, 800, U_OTHER_LETTER},             // MONGOLIAN LETTER ALI GALI BALUDA (Mn since 9.0)
    {0x1886, 800, U_OTHER_LETTER},             // … THREE BALUDA (Mn since 9.0)
    {0x166D, 1100, U_OTHER_PUNCTUATION},       // CANADIAN SYLLABICS CHI SIGN (So since 12.0)
    {0xA9BD, 1100, U_COMBINING_SPACING_MARK},  // JAVANESE CONSONANT SIGN KERET (Mn since 12.0)
    {0x111C9, 1000, U_OTHER_PUNCTUATION},      // SHARADA SANDHI MARK (Mn since 11.0)
};

int Age(char32_t c) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(c), age);
  return age[0] * 100 + age[1];
}

std::u16string ToUtf16(std::u32string_view text) {
  std::u16string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c >= 0x10000) {
      out.push_back(static_cast<char16_t>(0xD7C0 + (c >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 | (c & 0x3FF)));
    } else {
      out.push_back(static_cast<char16_t>(c));
    }
  }
  return out;
}

std::u32string FromUtf16(std::u16string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    if (c >= 0xD800 && c < 0xDC00 && i + 1 < text.size() && text[i + 1] >= 0xDC00 &&
        text[i + 1] < 0xE000) {
      out.push_back(0x10000 + ((c - 0xD800) << 10) + (text[i + 1] - 0xDC00));
      ++i;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void CheckIcu(UErrorCode status, const char* what) {
  if (U_FAILURE(status)) {
    throw std::runtime_error(fmt::format("ICU {} failed: {}", what, u_errorName(status)));
  }
}

std::u32string Normalize(const icu::Normalizer2* normalizer, std::u32string_view text) {
  const std::u16string utf16 = ToUtf16(text);
  icu::UnicodeString source(reinterpret_cast<const UChar*>(utf16.data()),
                            static_cast<int32_t>(utf16.size()));
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString result = normalizer->normalize(source, status);
  CheckIcu(status, "normalization");
  return FromUtf16(std::u16string_view(reinterpret_cast<const char16_t*>(result.getBuffer()),
                                       static_cast<size_t>(result.length())));
}

std::u32string Lower(std::u32string_view text) {
  const std::u16string in = ToUtf16(text);
  std::u16string out(in.size() * 3 + 4, u'\0');
  UErrorCode status = U_ZERO_ERROR;
  int32_t n = u_strToLower(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()),
                           reinterpret_cast<const UChar*>(in.data()),
                           static_cast<int32_t>(in.size()), "", &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    out.resize(static_cast<size_t>(n));
    status = U_ZERO_ERROR;
    n = u_strToLower(reinterpret_cast<UChar*>(out.data()), n,
                     reinterpret_cast<const UChar*>(in.data()), static_cast<int32_t>(in.size()), "",
                     &status);
  }
  CheckIcu(status, "lowercase");
  out.resize(static_cast<size_t>(n));
  return FromUtf16(out);
}

}  // namespace

std::u32string DecodeUtf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b = s[i];
    int length;
    char32_t c, min;
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      length = 2, c = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      length = 3, c = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      length = 4, c = b & 0x07, min = 0x10000;
    } else {
      throw std::invalid_argument(
          fmt::format("invalid UTF-8 at byte offset {}: byte 0x{:02x} starts no character", i, b));
    }
    if (i + length > n) {
      throw std::invalid_argument(
          fmt::format("invalid UTF-8 at byte offset {}: the text ends inside a character", i));
    }
    for (int k = 1; k < length; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) {
        throw std::invalid_argument(
            fmt::format("invalid UTF-8 at byte offset {}: byte 0x{:02x} continues no character",
                        i + k, s[i + k]));
      }
      c = (c << 6) | (s[i + k] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c < 0xE000)) {
      throw std::invalid_argument(fmt::format(
          "invalid UTF-8 at byte offset {}: U+{:04X} (an overlong form, a surrogate or beyond "
          "U+10FFFF)",
          i, static_cast<uint32_t>(c)));
    }
    out.push_back(c);
    i += length;
  }
  return out;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string EncodeUtf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text)
    AppendUtf8(c, &out);
  return out;
}

UCharCategory CategoryAsOf(char32_t c, int version) {
  for (const CategoryChange& change : kCategoryChanges) {
    if (change.c == c && version <= change.until) return change.category;
  }
  if (Age(c) > version) return U_UNASSIGNED;
  return static_cast<UCharCategory>(u_charType(static_cast<UChar32>(c)));
}

bool IsControlCategory(UCharCategory cat) {
  return cat == U_CONTROL_CHAR || cat == U_FORMAT_CHAR || cat == U_SURROGATE ||
         cat == U_PRIVATE_USE_CHAR || cat == U_UNASSIGNED;
}

bool IsPunctuationCategory(UCharCategory cat) {
  return cat == U_CONNECTOR_PUNCTUATION || cat == U_DASH_PUNCTUATION ||
         cat == U_START_PUNCTUATION || cat == U_END_PUNCTUATION || cat == U_INITIAL_PUNCTUATION ||
         cat == U_FINAL_PUNCTUATION || cat == U_OTHER_PUNCTUATION;
}

bool IsLetterCategory(UCharCategory cat) {
  return cat == U_UPPERCASE_LETTER || cat == U_LOWERCASE_LETTER || cat == U_TITLECASE_LETTER ||
         cat == U_MODIFIER_LETTER || cat == U_OTHER_LETTER;
}

bool IsNumberCategory(UCharCategory cat) {
  return cat == U_DECIMAL_DIGIT_NUMBER || cat == U_LETTER_NUMBER || cat == U_OTHER_NUMBER;
}

bool IsWhiteSpace(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

bool IsPythonSpace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  const UCharCategory cat = static_cast<UCharCategory>(u_charType(static_cast<UChar32>(c)));
  if (cat == U_SPACE_SEPARATOR || cat == U_LINE_SEPARATOR || cat == U_PARAGRAPH_SEPARATOR) {
    return true;
  }
  const UCharDirection dir = u_charDirection(static_cast<UChar32>(c));
  return dir == U_WHITE_SPACE_NEUTRAL || dir == U_BLOCK_SEPARATOR || dir == U_SEGMENT_SEPARATOR;
}

bool IsBertChineseChar(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

std::u32string Nfc(std::u32string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  CheckIcu(status, "NFC");
  return Normalize(nfc, text);
}

std::u32string Nfd(std::u32string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
  CheckIcu(status, "NFD");
  return Normalize(nfd, text);
}

std::u32string Nfd(std::u32string_view text, int version) {
  std::u32string out;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && Age(text[i]) <= version) continue;
    out += Nfd(text.substr(start, i - start));
    if (i < text.size()) out.push_back(text[i]);
    start = i + 1;
  }
  return out;
}

std::u32string ToLower(std::u32string_view text) {
  return Lower(text);
}

void AppendLower(char32_t c, std::u32string* out) {
  if (c < 0x80) {
    out->push_back(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
    return;
  }
  const char32_t one[1] = {c};
  out->append(Lower(std::u32string_view(one, 1)));
}

char32_t FoldCase(char32_t c) {
  return static_cast<char32_t>(u_foldCase(static_cast<UChar32>(c), U_FOLD_CASE_DEFAULT));
}

}  // namespace difftrain::text
