// Unicode helpers of the tokenizers (model/text/tokenizer.h), on ICU (libicu 72: Unicode 15.0).
//
// The references they match use older tables: Python 3.11's unicodedata has Unicode 14.0 (the
// slow CLIPTokenizer), and Hugging Face `tokenizers` 0.19 (the fast BERT tokenizer) takes its
// categories from the `unicode_categories` crate and its NFD from a crate, both with Unicode
// 8.0's tables. So each tokenizer asks for a character's category (CategoryAsOf) and
// decomposition (Nfd) as of a Unicode version: a character assigned later is unassigned (Cn)
// there and does not decompose, and the six whose category changed since are listed in
// unicode.cc. With that every code point tokenizes as the references do
// (tests/tokenizer_reference_test.cc). Characters new in Unicode 15.0 fall out of that rule
// too: Python drops them as unassigned, and so does ICU's Unicode 15 data read "as of 14.0".
// Case mappings (ICU's full lowercase, Python's str.lower, Rust's to_lowercase) agree on
// every code point, NFC as well; a text mixing marks with characters newer than 8.0 could
// still order its marks differently from the crate's NFD (not seen in any test).
#pragma once

#include <string>
#include <string_view>

#include <unicode/uchar.h>

namespace difftrain::text {

// UTF-8 → code points. Overlong forms, surrogates, values above U+10FFFF and truncated or
// stray bytes throw std::invalid_argument naming the byte offset of the bad sequence.
std::u32string DecodeUtf8(std::string_view text);
void AppendUtf8(char32_t c, std::string* out);
std::string EncodeUtf8(std::u32string_view text);

// A Unicode version as major * 100 + minor (8.0 → 800, 14.0 → 1400).
constexpr int kUnicode8 = 800;
constexpr int kUnicode14 = 1400;

// The general category (ICU's UCharCategory) of `c` as of Unicode `version`: U_UNASSIGNED
// for a character assigned after it.
UCharCategory CategoryAsOf(char32_t c, int version);

bool IsControlCategory(UCharCategory cat);      // Cc, Cf, Cs, Co, Cn: "C*"
bool IsPunctuationCategory(UCharCategory cat);  // Pc, Pd, Ps, Pe, Pi, Pf, Po: "P*"
bool IsLetterCategory(UCharCategory cat);       // Lu, Ll, Lt, Lm, Lo: "L*"
bool IsNumberCategory(UCharCategory cat);       // Nd, Nl, No: "N*"

// The White_Space property (Rust's char::is_whitespace).
bool IsWhiteSpace(char32_t c);
// Python's str.isspace(): White_Space-like bidi classes WS, B and S, or categories Zs, Zl, Zp
// (U+001C..U+001F included), as str.split() without arguments splits on.
bool IsPythonSpace(char32_t c);

// CJK ideographs as BERT's _is_chinese_char defines them (CJK Unified Ideographs and their
// extensions A–E, the compatibility ideographs and their supplement).
bool IsBertChineseChar(char32_t c);

// Canonical composition / decomposition. Nfd with a `version` decomposes as that version's
// tables do: a character assigned later stays as it is (and, like any starter, ends the run
// of combining marks that are put in canonical order).
std::u32string Nfc(std::u32string_view text);
std::u32string Nfd(std::u32string_view text);
std::u32string Nfd(std::u32string_view text, int version);

// Full lowercase mapping of the whole text with the context of final sigma (Python's
// str.lower(), Rust's str::to_lowercase).
std::u32string ToLower(std::u32string_view text);
// Full lowercase mapping of one character alone (Rust's char::to_lowercase): Σ → σ always.
void AppendLower(char32_t c, std::u32string* out);
// Simple case folding (the `regex` module's IGNORECASE).
char32_t FoldCase(char32_t c);

}  // namespace difftrain::text
