// Python's repr of doubles, for JSON written as json.dumps writes it (docs/formats.md, the
// foxglove MCAP profile). The numpy/Python reference is eva/formats/mcap/json_rows.py
// (``repr(float(v))``); the tests compare both on random bit patterns.
#pragma once

#include <cstddef>
#include <cstdint>

namespace eva {

// Longest repr of a finite double: "-" + 17 digits + "." + "e-308" and the like.
constexpr std::size_t FLOAT_REPR_MAX = 32;

// Write repr(v) of each finite value back to back into `out` (room for n * FLOAT_REPR_MAX
// bytes) and its length into `lengths`; return the bytes written. The digits are the shortest
// that read back as the same double (std::to_chars); the layout is Python's: positional for
// decimal exponents -4..15 with ".0" on whole numbers, else d.ddde+XX. NaN and infinity are
// written "nan", "inf", "-inf".
std::size_t float_repr(const double* values, std::size_t n, char* out, std::int64_t* lengths);

}  // namespace eva
